package software.amazon.kinesis.multilang;

import com.beust.jcommander.JCommander;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.multilang.config.CopierSchedulerBuilder;

/**
 * copier's entry point of the KCL MultiLangDaemon: the stock daemon with one setting its properties file
 * cannot reach, the interval at which the KCL's scheduler advances its shard consumers
 * ({@code CoordinatorConfig.shardConsumerDispatchPollIntervalMillis}, 1 s in KCL 3.1.3).
 *
 * <p>Why: a shard consumer moves one state per pass of the scheduler (waiting on parents, initializing,
 * processing; shutdown requested, shutting down, shut down), so every start and every graceful stop waits
 * out several passes. At 1 s that is most of a rolling deploy's pause per shard. copier run passes the
 * interval as the system property {@value #DISPATCH_PROPERTY} (copier.shardConsumerDispatchPollIntervalMillis
 * in the properties file); without it this class runs the stock daemon unchanged.
 *
 * <p>The class sits in the daemon's package because {@code buildScheduler} and the steps of
 * {@code MultiLangDaemon.main} are package-private; {@code main} repeats the stock one (KCL 3.1.3) with
 * this class in place of {@code MultiLangDaemon}. Everything else (argument parsing, logging, the shutdown
 * hook with {@code shutdownGraceMillis}, the exit code) is the stock daemon's own code.
 */
public final class CopierMultiLangDaemon extends MultiLangDaemon {
    /** The system property holding the interval in milliseconds. */
    public static final String DISPATCH_PROPERTY = "copier.shardConsumerDispatchPollIntervalMillis";

    private static final Logger LOG = LoggerFactory.getLogger(CopierMultiLangDaemon.class);

    private final Long dispatchMillis;

    CopierMultiLangDaemon(final Long dispatchMillis) {
        this.dispatchMillis = dispatchMillis;
    }

    @Override
    Scheduler buildScheduler(final MultiLangDaemonConfig config) {
        if (dispatchMillis == null) {
            return super.buildScheduler(config);
        }
        final Scheduler scheduler = CopierSchedulerBuilder.build(
                config.getMultiLangDaemonConfiguration(), config.getRecordProcessorFactory(), dispatchMillis);
        LOG.info(
                "copier: the KCL scheduler advances shard consumers every {} ms",
                scheduler.shardConsumerDispatchPollIntervalMillis());
        return scheduler;
    }

    public static void main(final String[] args) {
        final String setting = System.getProperty(DISPATCH_PROPERTY);
        Long dispatchMillis = null;
        if (setting != null) {
            try {
                dispatchMillis = Long.valueOf(setting.trim());
            } catch (NumberFormatException e) {
                dispatchMillis = -1L;
            }
            if (dispatchMillis <= 0) {
                System.err.println(
                        "copier: -D" + DISPATCH_PROPERTY + "=" + setting + " is not a positive number of milliseconds");
                System.exit(1);
            }
        }
        final CopierMultiLangDaemon daemon = new CopierMultiLangDaemon(dispatchMillis);
        int exitCode = 1;
        final MultiLangDaemonArguments arguments = new MultiLangDaemonArguments();
        final JCommander jCommander = daemon.buildJCommanderAndParseArgs(arguments, args);
        try {
            final String propertiesFileName = daemon.validateAndGetPropertiesFileName(arguments);
            daemon.configureLogging(arguments.logConfiguration);
            final MultiLangDaemonConfig config = daemon.buildMultiLangDaemonConfig(propertiesFileName);
            final Scheduler scheduler = daemon.buildScheduler(config);
            final MultiLangRunner runner = new MultiLangRunner(scheduler);
            daemon.setupShutdownHook(Runtime.getRuntime(), runner, config);
            exitCode = daemon.submitRunnerAndWait(config, runner);
        } catch (Throwable t) {
            t.printStackTrace(System.err);
            daemon.printUsage(jCommander, t.getMessage());
        }
        daemon.exit(exitCode);
    }
}
