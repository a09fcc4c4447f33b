package software.amazon.kinesis.coordinator;

import java.util.concurrent.ThreadLocalRandom;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.kinesis.checkpoint.CheckpointConfig;
import software.amazon.kinesis.leases.LeaseManagementConfig;
import software.amazon.kinesis.leases.exceptions.DependencyException;
import software.amazon.kinesis.leases.exceptions.InvalidStateException;
import software.amazon.kinesis.leases.exceptions.ProvisionedThroughputException;
import software.amazon.kinesis.lifecycle.LifecycleConfig;
import software.amazon.kinesis.metrics.MetricsConfig;
import software.amazon.kinesis.processor.ProcessorConfig;
import software.amazon.kinesis.retrieval.RetrievalConfig;

/**
 * The KCL scheduler with a shorter wait on an empty lease table.
 *
 * <p>Why: on a new application (no leases yet) every KCL 3.1.3 worker waits a random 1 to 30 s, checking every
 * 3 s whether another worker has created the leases, before it lists the shards and creates them itself
 * ({@code Scheduler.shouldInitiateLeaseSync}, constants private). That spreads the shard syncs of a fleet started
 * all at once, at the price of up to 30 s before the first event of every new pipeline. Here the wait is at most
 * {@code maxWaitMillis} (random below it, checked every {@value #CHECK_MILLIS} ms or sooner): a fleet's workers
 * still mostly leave the sync to the first of them, and one that syncs as well only repeats conditional lease
 * creations that fail harmlessly. 0: sync at once while the table is empty. Nothing else differs.
 *
 * <p>In this package because the method is package-private.
 */
public class CopierScheduler extends Scheduler {
    /** How often the wait looks at the lease table again. */
    static final long CHECK_MILLIS = 500L;

    private static final Logger LOG = LoggerFactory.getLogger(CopierScheduler.class);

    private final long maxWaitMillis;

    public CopierScheduler(
            final CheckpointConfig checkpointConfig,
            final CoordinatorConfig coordinatorConfig,
            final LeaseManagementConfig leaseManagementConfig,
            final LifecycleConfig lifecycleConfig,
            final MetricsConfig metricsConfig,
            final ProcessorConfig processorConfig,
            final RetrievalConfig retrievalConfig,
            final long maxWaitMillis) {
        super(
                checkpointConfig,
                coordinatorConfig,
                leaseManagementConfig,
                lifecycleConfig,
                metricsConfig,
                processorConfig,
                retrievalConfig);
        this.maxWaitMillis = maxWaitMillis;
    }

    /** The longest this worker waits for another to create the leases of a new application. */
    public long emptyLeaseTableWaitMillis() {
        return maxWaitMillis;
    }

    @Override
    boolean shouldInitiateLeaseSync()
            throws InterruptedException, DependencyException, ProvisionedThroughputException, InvalidStateException {
        final long waitMillis = maxWaitMillis == 0 ? 0 : ThreadLocalRandom.current().nextLong(maxWaitMillis + 1);
        final long waitUntil = System.currentTimeMillis() + waitMillis;
        boolean empty = leaseRefresher().isLeaseTableEmpty();
        if (empty) {
            LOG.info(
                    "copier: the lease table is empty; waiting {} ms for another worker to create the leases",
                    waitMillis);
        }
        while (empty && System.currentTimeMillis() < waitUntil) {
            Thread.sleep(Math.min(CHECK_MILLIS, Math.max(1L, waitUntil - System.currentTimeMillis())));
            empty = leaseRefresher().isLeaseTableEmpty();
        }
        return empty;
    }
}
