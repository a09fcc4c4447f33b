"""copier: exactly-once Kinesis-to-Kinesis forwarding."""
