package software.amazon.kinesis.multilang;

import com.beust.jcommander.JCommander;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.kinesis.coordinator.CopierScheduler;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.leader.CopierLeaderDecider;
import software.amazon.kinesis.multilang.config.CopierSchedulerBuilder;

/**
 * copier's entry point of the KCL MultiLangDaemon: the stock daemon with three settings its properties file
 * cannot reach, each passed by copier run as a system property (the properties key of the same name):
 *
 * <ul>
 *   <li>{@value #DISPATCH_PROPERTY}: the interval at which the KCL's scheduler advances its shard consumers
 *       ({@code CoordinatorConfig.shardConsumerDispatchPollIntervalMillis}, 1 s in KCL 3.1.3). A shard consumer
 *       moves one state per pass of the scheduler (waiting on parents, initializing, processing; shutdown
 *       requested, shutting down, shut down), so every start and every graceful stop waits out several passes.
 *       At 1 s that is most of a rolling deploy's pause per shard.
 *   <li>{@value #EMPTY_TABLE_WAIT_PROPERTY}: the longest a worker waits on an empty lease table for another to
 *       create the leases ({@code CopierScheduler}; the KCL waits a random 1 to 30 s), most of a new
 *       pipeline's time to its first event.
 *   <li>{@value #LEADER_LOCK_PROPERTY}: how long the KCL 3.x leader lock lasts ({@code CopierScheduler}; the KCL
 *       holds it 2 minutes), what a dead leader's shards wait before the leases are assigned again.
 * </ul>
 *
 * <p>Without any of the properties this class runs the stock daemon unchanged. The class sits in the daemon's package
 * because {@code buildScheduler} and the steps of {@code MultiLangDaemon.main} are package-private; {@code main}
 * repeats the stock one (KCL 3.1.3) with this class in place of {@code MultiLangDaemon}. Everything else
 * (argument parsing, logging, the shutdown hook with {@code shutdownGraceMillis}, the exit code) is the stock
 * daemon's own code.
 */
public final class CopierMultiLangDaemon extends MultiLangDaemon {
    /** The system property holding the interval in milliseconds. */
    public static final String DISPATCH_PROPERTY = "copier.shardConsumerDispatchPollIntervalMillis";

    /** The system property holding the longest wait on an empty lease table, in milliseconds. */
    public static final String EMPTY_TABLE_WAIT_PROPERTY = "copier.emptyLeaseTableWaitMillis";

    /** The system property holding the leader lock's lease, in milliseconds. */
    public static final String LEADER_LOCK_PROPERTY = "copier.leaderLockMillis";

    /** The system property saying that a graceful stop hands the worker's leases on (true: its workerId is new each run). */
    public static final String HAND_ON_PROPERTY = "copier.handOnLeases";

    private static final Logger LOG = LoggerFactory.getLogger(CopierMultiLangDaemon.class);

    private final Long dispatchMillis;
    private final Long emptyTableWaitMillis;
    private final Long leaderLockMillis;
    private final boolean handOnLeases;

    CopierMultiLangDaemon(
            final Long dispatchMillis,
            final Long emptyTableWaitMillis,
            final Long leaderLockMillis,
            final boolean handOnLeases) {
        this.dispatchMillis = dispatchMillis;
        this.emptyTableWaitMillis = emptyTableWaitMillis;
        this.leaderLockMillis = leaderLockMillis;
        this.handOnLeases = handOnLeases;
    }

    @Override
    Scheduler buildScheduler(final MultiLangDaemonConfig config) {
        if (dispatchMillis == null && emptyTableWaitMillis == null && leaderLockMillis == null && !handOnLeases) {
            return super.buildScheduler(config);
        }
        final Scheduler scheduler = CopierSchedulerBuilder.build(
                config.getMultiLangDaemonConfiguration(),
                config.getRecordProcessorFactory(),
                dispatchMillis,
                emptyTableWaitMillis,
                leaderLockMillis,
                handOnLeases);
        LOG.info(
                "copier: the KCL scheduler advances shard consumers every {} ms",
                scheduler.shardConsumerDispatchPollIntervalMillis());
        if (scheduler instanceof CopierScheduler) {
            final CopierScheduler copier = (CopierScheduler) scheduler;
            if (copier.emptyLeaseTableWaitMillis() != null) {
                LOG.info(
                        "copier: on an empty lease table this worker waits at most {} ms before it creates the leases",
                        copier.emptyLeaseTableWaitMillis());
            }
            if (copier.leaderLockMillis() != null) {
                LOG.info("copier: the leader lock lasts {} ms", copier.leaderLockMillis());
            }
            LOG.info(copier.handsOnLeases()
                    ? "copier: a graceful stop hands this worker's leases on (its workerId is new each run)"
                    : "copier: a graceful stop keeps this worker's leases for its restart under the same workerId");
        }
        return scheduler;
    }

    /** The property's value, null when it is not set; exits with a message when it is not a number >= min. */
    private static Long millisProperty(final String name, final long min) {
        final String setting = System.getProperty(name);
        if (setting == null) {
            return null;
        }
        try {
            final long millis = Long.parseLong(setting.trim());
            if (millis >= min) {
                return millis;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        System.err.println("copier: -D" + name + "=" + setting + " is not a number of milliseconds >= " + min);
        System.exit(1);
        return null;
    }

    public static void main(final String[] args) {
        final CopierMultiLangDaemon daemon = new CopierMultiLangDaemon(
                millisProperty(DISPATCH_PROPERTY, 1),
                millisProperty(EMPTY_TABLE_WAIT_PROPERTY, 0),
                millisProperty(LEADER_LOCK_PROPERTY, CopierLeaderDecider.MIN_LEASE_MILLIS),
                Boolean.getBoolean(HAND_ON_PROPERTY));
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
