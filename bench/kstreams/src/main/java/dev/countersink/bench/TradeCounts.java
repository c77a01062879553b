package dev.countersink.bench;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * Per symbol, the number of trades and the sum of their {@code qty}: the bench's "trades" and "shares" counters,
 * kept by Kafka Streams with exactly-once v2 in a RocksDB store (its changelog in Kafka).
 *
 * <pre>java -cp target/classes:target/lib/* dev.countersink.bench.TradeCounts BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR [THREADS]</pre>
 *
 * <p>The input topic is keyed by symbol (JSON trades), so the aggregation needs no repartition topic. Every
 * update of a symbol's totals goes to OUTPUT, keyed by symbol, as 16 bytes: the count and the sum, each a
 * big-endian long; the last committed record of a key is its value. It runs until SIGTERM, and exits 1 if
 * the application fails.
 */
public final class TradeCounts {

    /** A trade as published by the bench; the other fields are not read. */
    record Trade(String symbol, long qty) {}

    /** The count and the sum of one symbol. */
    record Totals(long count, long sum) {
        static final Totals ZERO = new Totals(0, 0);

        Totals add(long qty) {
            return new Totals(count + 1, Math.addExact(sum, qty));
        }
    }

    static final Serde<Totals> TOTALS = Serdes.serdeFrom(
            (Serializer<Totals>) (topic, totals) -> totals == null ? null
                    : ByteBuffer.allocate(16).putLong(totals.count()).putLong(totals.sum()).array(),
            (Deserializer<Totals>) (topic, bytes) -> {
                if (bytes == null) {
                    return null;
                }
                ByteBuffer buffer = ByteBuffer.wrap(bytes);
                return new Totals(buffer.getLong(), buffer.getLong());
            });

    private static final ObjectMapper JSON = new ObjectMapper()
            .configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false)
            .configure(DeserializationFeature.ACCEPT_FLOAT_AS_INT, false);

    static long qty(byte[] value) {
        try {
            return JSON.readValue(value, Trade.class).qty();
        } catch (IOException e) {
            throw new UncheckedIOException("a trade that is not JSON with an integer qty", e);
        }
    }

    static Topology topology(String input, String output) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()))
                .mapValues(TradeCounts::qty)
                .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
                .aggregate(() -> Totals.ZERO, (symbol, qty, totals) -> totals.add(qty),
                        Materialized.<String, Totals, KeyValueStore<Bytes, byte[]>>as("totals")
                                .withKeySerde(Serdes.String()).withValueSerde(TOTALS))
                .toStream()
                .to(output, Produced.with(Serdes.String(), TOTALS));
        return builder.build();
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 5 || args.length > 6) {
            System.err.println("usage: TradeCounts BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR [THREADS]");
            System.exit(2);
        }
        int threads = args.length == 6 ? Integer.parseInt(args[5]) : 1;
        Runner.run(topology(args[1], args[2]), Runner.config(args[0], args[3], Path.of(args[4]), threads));
    }
}
