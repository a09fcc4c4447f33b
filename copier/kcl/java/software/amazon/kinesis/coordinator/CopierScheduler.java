package software.amazon.kinesis.coordinator;

import java.lang.reflect.Field;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.Callable;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.Supplier;
import java.util.stream.Collectors;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import software.amazon.kinesis.checkpoint.CheckpointConfig;
import software.amazon.kinesis.leases.Lease;
import software.amazon.kinesis.leases.LeaseManagementConfig;
import software.amazon.kinesis.leases.exceptions.DependencyException;
import software.amazon.kinesis.leases.exceptions.InvalidStateException;
import software.amazon.kinesis.leases.exceptions.ProvisionedThroughputException;
import software.amazon.kinesis.leader.CopierLeaderDecider;
import software.amazon.kinesis.leader.DynamoDBLockBasedLeaderDecider;
import software.amazon.kinesis.lifecycle.LifecycleConfig;
import software.amazon.kinesis.metrics.MetricsConfig;
import software.amazon.kinesis.metrics.MetricsFactory;
import software.amazon.kinesis.processor.ProcessorConfig;
import software.amazon.kinesis.retrieval.RetrievalConfig;
import software.amazon.kinesis.worker.metricstats.WorkerMetricStats;
import software.amazon.kinesis.worker.metricstats.WorkerMetricStatsDAO;

/**
 * The KCL scheduler with two of its waits shortened; {@code null} for either keeps the KCL's own.
 *
 * <p>The wait on an empty lease table: on a new application (no leases yet) every KCL 3.1.3 worker waits a
 * random 1 to 30 s, checking every 3 s whether another worker has created the leases, before it lists the shards
 * and creates them itself ({@code Scheduler.shouldInitiateLeaseSync}, constants private). That spreads the shard
 * syncs of a fleet started all at once, at the price of up to 30 s before the first event of every new pipeline.
 * Here the wait is at most {@code maxWaitMillis} (random below it, checked every {@value #CHECK_MILLIS} ms or
 * sooner): a fleet's workers still mostly leave the sync to the first of them, and one that syncs as well only
 * repeats conditional lease creations that fail harmlessly. 0: sync at once while the table is empty.
 *
 * <p>The leader lock: KCL 3.x workers elect the one that assigns leases with a DynamoDB lock held for a fixed
 * 2 minutes, so a dead leader's shards wait that long for a new owner ({@link CopierLeaderDecider}). Here the
 * lock lasts {@code leaderLockMillis}. The scheduler builds its decider only when it runs, from a supplier it
 * keeps in a private field of its migration components; that supplier is replaced here, by reflection, since
 * no setting or hook reaches it. If this KCL's scheduler has no such field the KCL's lock stays, with a warning.
 *
 * <p>A graceful stop of a worker whose workerId is new each run ({@code handOnLeases}) hands its leases on: the
 * KCL stops renewing a worker's leases when it stops gracefully but leaves them in the lease table under its name,
 * so no other worker is given them until they expire ({@code failoverTimeMillis}), and a worker under a new ID
 * never renews them; its shards pause that long. Here, once every shard consumer has acknowledged the stop (the
 * KCL's notification latch: normally each processor has checkpointed and released copier's own lease, but one
 * whose shutdown_requested failed, or one started on a lease the stop found without a consumer, may still be
 * forwarding), the worker first deletes its own WorkerMetricStats row (else the leader, counting it active for
 * another two reports, gives the leases straight back to it) and then evicts every lease the table names it the
 * owner of (their owner removed, conditional on it still being this worker; the leader may have given it more
 * while the stop ran); the leader assigns them on its next pass. A worker with a workerId of its own keeps them: restarted in place it renews them at once, with no
 * leader's pass to wait for (a host that never comes back leaves them to expire). Only a graceful stop does any
 * of this: after a crash the leases expire as before. Exactly-once never rests on the KCL's leases: a processor
 * started on a shard another still works sleeps out copier's lease (docs/protocol.md).
 *
 * <p>In this package because {@code shouldInitiateLeaseSync} and {@code createWorkerShutdownCallable} are
 * package-private.
 */
public class CopierScheduler extends Scheduler {
    /** How often the wait looks at the lease table again. */
    static final long CHECK_MILLIS = 500L;

    /** Reads of this worker's metrics row for its conditional delete at a graceful stop. */
    static final int FORGET_ATTEMPTS = 3;

    private static final Logger LOG = LoggerFactory.getLogger(CopierScheduler.class);

    private final Long maxWaitMillis;
    private final Long leaderLockMillis;
    private final boolean handOnLeases;
    private final AtomicBoolean gracefulStop = new AtomicBoolean();

    public CopierScheduler(
            final CheckpointConfig checkpointConfig,
            final CoordinatorConfig coordinatorConfig,
            final LeaseManagementConfig leaseManagementConfig,
            final LifecycleConfig lifecycleConfig,
            final MetricsConfig metricsConfig,
            final ProcessorConfig processorConfig,
            final RetrievalConfig retrievalConfig,
            final Long maxWaitMillis,
            final Long leaderLockMillis,
            final boolean handOnLeases) {
        super(
                checkpointConfig,
                coordinatorConfig,
                leaseManagementConfig,
                lifecycleConfig,
                metricsConfig,
                processorConfig,
                retrievalConfig);
        this.maxWaitMillis = maxWaitMillis;
        this.handOnLeases = handOnLeases;
        this.leaderLockMillis = leaderLockMillis != null && replaceLeaderDecider(leaderLockMillis)
                ? leaderLockMillis
                : null;
    }

    /** The longest this worker waits for another to create the leases of a new application (null: the KCL's). */
    public Long emptyLeaseTableWaitMillis() {
        return maxWaitMillis;
    }

    /** Whether a graceful stop hands this worker's leases on (its workerId is new each run). */
    public boolean handsOnLeases() {
        return handOnLeases;
    }

    /** How long the leader lock lasts when this worker holds it (null: the KCL's 2 minutes). */
    public Long leaderLockMillis() {
        return leaderLockMillis;
    }

    /** Makes the scheduler build its 3.x leader decider with a {@code leaseMillis} lock; false if it cannot. */
    private boolean replaceLeaderDecider(final long leaseMillis) {
        try {
            final Object components = migrationComponents();
            final Class<?> type = DynamicMigrationComponentsInitializer.class;
            final CoordinatorStateDAO dao =
                    (CoordinatorStateDAO) field(type, "coordinatorStateDAO").get(components);
            final String workerId = leaseCoordinator().workerIdentifier();
            final MetricsFactory metrics = metricsFactory();
            final Supplier<DynamoDBLockBasedLeaderDecider> creator =
                    () -> CopierLeaderDecider.create(dao, workerId, leaseMillis, metrics);
            field(type, "ddbLockBasedLeaderDeciderCreator").set(components, creator);
            return true;
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.warn(
                    "copier: cannot set the leader lock's lease in this KCL version ({}); the KCL's 2 minutes apply",
                    e.toString());
            return false;
        }
    }

    @Override
    Callable<GracefulShutdownContext> createWorkerShutdownCallable() {
        final Callable<GracefulShutdownContext> stock = super.createWorkerShutdownCallable();
        if (!handOnLeases) {
            return stock;
        }
        return () -> {
            gracefulStop.set(true);
            return stock.call();
        };
    }

    /**
     * The KCL's shutdown, then, after a graceful stop's notifications, this worker's leases handed on: every lease
     * the table names it the owner of now, not only those it held when the stop began (while its notifications
     * run, the leader may still assign it leases: another stopping worker's, a dead one's, a new child shard's;
     * this worker, once stopped, would never renew them).
     */
    @Override
    public void shutdown() {
        super.shutdown();
        if (!gracefulStop.getAndSet(false)) {
            return;
        }
        final String me = leaseCoordinator().workerIdentifier();
        forgetWorkerMetrics(me, workerMetricsDao());
        final List<Lease> owned;
        try {
            owned = leaseRefresher().listLeases().stream()
                    .filter(lease -> me.equals(lease.leaseOwner()))
                    .collect(Collectors.toList());
        } catch (DependencyException | InvalidStateException | ProvisionedThroughputException | RuntimeException e) {
            LOG.warn("copier: this worker's leases not handed on, the lease table cannot be read ({}); they expire",
                    e.toString());
            return;
        }
        int evicted = 0;
        for (final Lease lease : owned) {
            try {
                if (leaseRefresher().evictLease(lease)) {
                    evicted++;
                }
            } catch (DependencyException | InvalidStateException | ProvisionedThroughputException | RuntimeException e) {
                LOG.warn("copier: lease {} not handed on ({}); it expires instead", lease.leaseKey(), e.toString());
            }
        }
        LOG.info("copier: {} of the {} leases this worker owned at its graceful stop handed on", evicted, owned.size());
    }

    /** The scheduler's WorkerMetricStats table (KCL 3.x), or null if this KCL keeps it elsewhere. */
    private WorkerMetricStatsDAO workerMetricsDao() {
        try {
            final Object components = migrationComponents();
            return (WorkerMetricStatsDAO)
                    field(DynamicMigrationComponentsInitializer.class, "workerMetricsDAO").get(components);
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.warn("copier: no WorkerMetricStats table in this KCL ({})", e.toString());
            return null;
        }
    }

    /**
     * Deletes this worker's WorkerMetricStats row, so the leader no longer counts it as a worker to assign to. The
     * delete is conditional on the row's last update as read (an eventually consistent scan may return the one
     * before the reporter's last), so a refused delete reads the row again, up to {@value #FORGET_ATTEMPTS} times.
     */
    private static void forgetWorkerMetrics(final String me, final WorkerMetricStatsDAO metrics) {
        if (metrics == null) {
            return;
        }
        try {
            for (int attempt = 0; attempt < FORGET_ATTEMPTS; attempt++) {
                final Optional<WorkerMetricStats> row = metrics.getAllWorkerMetricStats().stream()
                        .filter(stats -> me.equals(stats.getWorkerId()))
                        .findFirst();
                if (row.isEmpty() || metrics.deleteMetrics(row.get())) {
                    return;
                }
            }
            LOG.warn("copier: this worker's metrics row stays; the leader may offer it its leases again");
        } catch (RuntimeException e) {
            LOG.info("copier: no metrics row of this worker deleted ({}): a 2.x-compatible application has none",
                    e.toString());
        }
    }

    /** The scheduler's private migration components (KCL 3.x): the leader decider's maker and the metrics table. */
    private Object migrationComponents() throws ReflectiveOperationException {
        return field(Scheduler.class, "migrationComponentsInitializer").get(this);
    }

    private static Field field(final Class<?> type, final String name) throws NoSuchFieldException {
        final Field field = type.getDeclaredField(name);
        field.setAccessible(true);
        return field;
    }

    @Override
    boolean shouldInitiateLeaseSync()
            throws InterruptedException, DependencyException, ProvisionedThroughputException, InvalidStateException {
        if (maxWaitMillis == null) {
            return super.shouldInitiateLeaseSync();
        }
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
