import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.Collections;
import java.util.List;

import software.amazon.kinesis.retrieval.AggregatorUtil;
import software.amazon.kinesis.retrieval.KinesisClientRecord;

/**
 * The KCL's own de-aggregation (AggregatorUtil, as the MultiLangDaemon runs it) on records given on stdin, for
 * tests/test_kpl.py to hold copier.core.kpl.as_daemon_delivers to, written to the file named by the first argument
 * (the KCL's logging may use stdout). One line in: the record's data in hex, its
 * partition key's UTF-8 in hex, the shard's starting and ending hash keys. One line out: "ERR" and the class of
 * what the KCL threw, or the number of records it delivers, then for each its partition key (UTF-16 code
 * units in hex, "-" if empty), its data in hex ("-" if empty) and its sub-sequence number, colon-separated.
 */
public final class KclDeaggregation {
    private static byte[] unhex(String text) {
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    private static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder();
        for (byte b : bytes) {
            out.append(String.format("%02x", b));
        }
        return out.length() == 0 ? "-" : out.toString();
    }

    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        AggregatorUtil util = new AggregatorUtil();
        StringBuilder out = new StringBuilder();
        String line;
        while ((line = in.readLine()) != null) {
            String[] fields = line.split(" ", -1);
            KinesisClientRecord record = KinesisClientRecord.builder()
                    .data(ByteBuffer.wrap(unhex(fields[0])))
                    .partitionKey(new String(unhex(fields[1]), StandardCharsets.UTF_8))
                    .sequenceNumber("1")
                    .approximateArrivalTimestamp(Instant.ofEpochMilli(1))
                    .build();
            try {
                List<KinesisClientRecord> delivered = util.deaggregate(
                        Collections.singletonList(record), new BigInteger(fields[2]), new BigInteger(fields[3]));
                out.append(delivered.size());
                for (KinesisClientRecord user : delivered) {
                    ByteBuffer data = user.data().duplicate();
                    byte[] bytes = new byte[data.remaining()];
                    data.get(bytes);
                    StringBuilder key = new StringBuilder();
                    for (char c : user.partitionKey().toCharArray()) {
                        key.append(String.format("%04x", (int) c));
                    }
                    out.append(' ').append(key.length() == 0 ? "-" : key).append(':').append(hex(bytes))
                            .append(':').append(user.subSequenceNumber());
                }
            } catch (Throwable thrown) {
                out.append("ERR ").append(thrown.getClass().getName());
            }
            out.append('\n');
        }
        java.nio.file.Files.writeString(java.nio.file.Path.of(args[0]), out);
    }
}
