package dev.countersink.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.processor.api.ContextualFixedKeyProcessor;
import org.apache.kafka.streams.processor.api.ContextualProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.WindowStore;

/**
 * An hourly count: events per key and per hour of their event time, the windowed equivalent of a countersink
 * count with {@code bucket = { field = TIME, size = "1h" }}, kept by Kafka Streams with exactly-once v2 in a
 * RocksDB window store.
 *
 * <pre>java -cp target/classes:target/lib/* dev.countersink.bench.HourlyCounts BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR THREADS KEY TIME [GRACE_HOURS]</pre>
 *
 * <p>KEY is a dotted path into the JSON event ({@code user.id}) or {@code @key}, the record key; TIME a dotted
 * path to an ISO-8601 time ({@code 2026-11-22T10:17:00Z}) or to a number of seconds since the epoch, or
 * {@code @timestamp}, the record time. An event lacking either is skipped, as a countersink counter skips an
 * event it does not apply to. Each event is parsed once; a key read from the event is a new key, so Kafka
 * Streams repartitions by it (through a topic) before counting. Events up to GRACE_HOURS (default 168) behind
 * the newest seen are still counted in their hour. Every update goes to OUTPUT keyed
 * {@code KEY|2026-11-22T10:00Z} (the hour's start in UTC, as countersink names a bucket), the count as a
 * big-endian long.
 *
 * <p>KEY may name several paths, comma-separated ({@code page,user.country}): several hourly counts kept by
 * one application, each event counted once under each path it has, through one repartition topic and one
 * window store. Their output keys then start with the path: {@code user.country=FR|2026-11-22T10:00Z}.
 */
public final class HourlyCounts {

    private static final ObjectMapper JSON = new ObjectMapper();
    static final DateTimeFormatter HOUR = DateTimeFormatter.ofPattern("yyyy-MM-dd'T'HH:mm'Z'")
            .withZone(ZoneOffset.UTC);

    /** An event's key and time, or null when it lacks one. */
    record Keyed(String key, long time) {}

    static JsonNode at(JsonNode event, String path) {
        JsonNode node = event.at("/" + path.replace('.', '/'));
        return node.isMissingNode() || node.isNull() ? null : node;
    }

    static JsonNode parse(byte[] value) {
        try {
            return JSON.readTree(value);
        } catch (IOException e) {
            throw new UncheckedIOException("an event that is not JSON", e);
        }
    }

    /** The event's time in milliseconds: an ISO-8601 text or a number of seconds; null when it has none. */
    static Long time(JsonNode event, long recordTime, String timePath) {
        if (timePath.equals("@timestamp")) {
            return recordTime;
        }
        JsonNode node = at(event, timePath);
        if (node != null && node.isTextual()) {
            return OffsetDateTime.parse(node.textValue()).toInstant().toEpochMilli();
        }
        if (node != null && node.isIntegralNumber()) {
            return Math.multiplyExact(node.longValue(), 1000L);
        }
        return null;
    }

    static String key(JsonNode event, String recordKey, String keyPath) {
        if (keyPath.equals("@key")) {
            return recordKey;
        }
        JsonNode node = at(event, keyPath);
        return node == null ? null : node.isTextual() ? node.textValue() : node.toString();
    }

    static Keyed keyed(String recordKey, long recordTime, byte[] value, String keyPath, String timePath) {
        JsonNode event = parse(value);
        String key = key(event, recordKey, keyPath);
        Long time = time(event, recordTime, timePath);
        return key == null || time == null ? null : new Keyed(key, time);
    }

    static Topology topology(String input, String output, String keyPath, String timePath, Duration grace) {
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, byte[]> events = builder.stream(input, Consumed.with(Serdes.String(), Serdes.ByteArray()));
        KStream<String, byte[]> timed;
        if (keyPath.equals("@key")) {  // the key stays: no repartition
            timed = events.processValues(() -> new ContextualFixedKeyProcessor<String, byte[], byte[]>() {
                @Override
                public void process(FixedKeyRecord<String, byte[]> record) {
                    Keyed keyed = keyed(record.key(), record.timestamp(), record.value(), keyPath, timePath);
                    if (keyed != null) {
                        context().forward(record.withTimestamp(keyed.time()));
                    }
                }
            });
        } else if (keyPath.contains(",")) {  // several counts: each event once under each path it has
            String[] paths = keyPath.split(",");
            timed = events.process(() -> new ContextualProcessor<String, byte[], String, byte[]>() {
                @Override
                public void process(Record<String, byte[]> record) {
                    JsonNode event = parse(record.value());
                    Long time = time(event, record.timestamp(), timePath);
                    if (time == null) {
                        return;
                    }
                    for (String path : paths) {
                        String key = key(event, record.key(), path);
                        if (key != null) {
                            context().forward(record.withKey(path + "=" + key).withTimestamp(time));
                        }
                    }
                }
            });
        } else {
            timed = events.process(() -> new ContextualProcessor<String, byte[], String, byte[]>() {
                @Override
                public void process(Record<String, byte[]> record) {
                    Keyed keyed = keyed(record.key(), record.timestamp(), record.value(), keyPath, timePath);
                    if (keyed != null) {
                        context().forward(record.withKey(keyed.key()).withTimestamp(keyed.time()));
                    }
                }
            });
        }
        timed.groupByKey(Grouped.with("by-key", Serdes.String(), Serdes.ByteArray()))
                .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofHours(1), grace))
                .count(Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("hourly")
                        .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                .toStream((window, count) -> window.key() + "|"
                        + HOUR.format(Instant.ofEpochMilli(window.window().start())))
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));
        return builder.build();
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 8 || args.length > 9) {
            System.err.println(
                    "usage: HourlyCounts BOOTSTRAP INPUT OUTPUT APP_ID STATE_DIR THREADS KEY TIME [GRACE_HOURS]");
            System.exit(2);
        }
        Duration grace = Duration.ofHours(args.length == 9 ? Long.parseLong(args[8]) : 168);
        Runner.run(topology(args[1], args[2], args[6], args[7], grace),
                Runner.config(args[0], args[3], Path.of(args[4]), Integer.parseInt(args[5])));
    }
}
