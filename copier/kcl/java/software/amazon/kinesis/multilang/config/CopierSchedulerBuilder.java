package software.amazon.kinesis.multilang.config;

import software.amazon.kinesis.coordinator.CopierScheduler;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.processor.ShardRecordProcessorFactory;

/**
 * The KCL scheduler the stock MultiLangDaemon would build from its properties, with copier's settings the
 * properties cannot reach: the shard-consumer dispatch interval, the longest wait on an empty lease table and the
 * leader lock's lease ({@link CopierScheduler}). In this package because {@code MultiLangDaemonConfiguration.resolvedConfiguration}
 * and the configuration objects it resolves are package-private (KCL 3.1.3).
 */
public final class CopierSchedulerBuilder {
    private CopierSchedulerBuilder() {}

    /**
     * Each setting null (and no hand-on): the KCL's own (a 1 s interval, a random 1-30 s wait, a 2-minute leader
     * lock, a graceful stop's leases left to expire).
     */
    public static Scheduler build(
            final MultiLangDaemonConfiguration configuration,
            final ShardRecordProcessorFactory factory,
            final Long dispatchMillis,
            final Long emptyTableWaitMillis,
            final Long leaderLockMillis,
            final boolean handOnLeases) {
        final MultiLangDaemonConfiguration.ResolvedConfiguration resolved =
                configuration.resolvedConfiguration(factory);
        if (dispatchMillis != null) {
            resolved.coordinatorConfig.shardConsumerDispatchPollIntervalMillis(dispatchMillis);
        }
        if (emptyTableWaitMillis == null && leaderLockMillis == null && !handOnLeases) {
            return resolved.build();
        }
        return new CopierScheduler(
                resolved.checkpointConfig,
                resolved.coordinatorConfig,
                resolved.leaseManagementConfig,
                resolved.lifecycleConfig,
                resolved.metricsConfig,
                resolved.processorConfig,
                resolved.retrievalConfig,
                emptyTableWaitMillis,
                leaderLockMillis,
                handOnLeases);
    }
}
