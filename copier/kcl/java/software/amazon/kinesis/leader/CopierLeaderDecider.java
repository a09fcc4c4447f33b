package software.amazon.kinesis.leader;

import software.amazon.kinesis.coordinator.CoordinatorStateDAO;
import software.amazon.kinesis.metrics.MetricsFactory;

/**
 * The KCL 3.x leader decider (a DynamoDB lock in the coordinator state table) with a lease copier chooses.
 *
 * <p>Why: in KCL 3.x only the leader assigns leases. KCL 3.1.3 holds its leader lock for a fixed 2 minutes
 * ({@code DynamoDBLockBasedLeaderDecider.DEFAULT_LEASE_DURATION_MILLIS}, private), so when the leader's host
 * dies, no worker is assigned the dead host's leases until that lock runs out: about 2 minutes of every one of
 * those shards stopped, against the seconds its leases take ({@code failoverTimeMillis}). A worker that comes back
 * under the same workerId does not need the leader (it renews its own leases at once), a replaced host (a new
 * workerId) does; and after a crash every worker waits the lock out, whatever its workerId (the lock client takes
 * a lock over only after seeing it unchanged for its lease, on its own clock; only a graceful stop releases it). The lease
 * only bounds how long a dead leader keeps the role: the live leader renews it every quarter of the lease (the
 * lock client wants at least three renewals a lease), and two leaders for a moment (a leader paused past the
 * lease) only race conditional lease writes, which the KCL already tolerates; copier's own lease fences the
 * shards' state whatever the KCL's leases do.
 *
 * <p>In this package because the factory that takes a lease duration is package-private.
 */
public final class CopierLeaderDecider {
    /** The least lease: the lock client renews a quarter of it, and below a few seconds a GC pause loses it. */
    public static final long MIN_LEASE_MILLIS = 4_000L;

    private CopierLeaderDecider() {}

    /** Renewal interval of a lease: a quarter of it, as the lock client asks for at least three a lease. */
    public static long heartbeatMillis(final long leaseMillis) {
        return leaseMillis / 4;
    }

    /** The KCL's decider with {@code leaseMillis} in place of its fixed 2 minutes. */
    public static DynamoDBLockBasedLeaderDecider create(
            final CoordinatorStateDAO coordinatorStateDao,
            final String workerId,
            final long leaseMillis,
            final MetricsFactory metricsFactory) {
        return DynamoDBLockBasedLeaderDecider.create(
                coordinatorStateDao, workerId, leaseMillis, heartbeatMillis(leaseMillis), metricsFactory);
    }
}
