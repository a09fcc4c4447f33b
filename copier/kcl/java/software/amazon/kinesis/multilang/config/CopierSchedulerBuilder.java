package software.amazon.kinesis.multilang.config;

import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.processor.ShardRecordProcessorFactory;

/**
 * The KCL scheduler the stock MultiLangDaemon would build from its properties, with the shard-consumer
 * dispatch interval set. In this package because {@code MultiLangDaemonConfiguration.resolvedConfiguration}
 * and the configuration objects it resolves are package-private (KCL 3.1.3).
 */
public final class CopierSchedulerBuilder {
    private CopierSchedulerBuilder() {}

    public static Scheduler build(
            final MultiLangDaemonConfiguration configuration,
            final ShardRecordProcessorFactory factory,
            final long dispatchMillis) {
        final MultiLangDaemonConfiguration.ResolvedConfiguration resolved =
                configuration.resolvedConfiguration(factory);
        resolved.coordinatorConfig.shardConsumerDispatchPollIntervalMillis(dispatchMillis);
        return resolved.build();
    }
}
