package dev.countersink.bench;

import java.nio.file.Path;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

/** What the bench's applications share: their configuration, and running one until SIGTERM. */
final class Runner {

    private static final String PREFIX = "streams.";

    private Runner() {}

    /**
     * Exactly-once v2, state under {@code stateDir} (RocksDB stores), internal topics of replication 1, and
     * whatever {@code -Dstreams.NAME=VALUE} system properties set; otherwise Kafka Streams' defaults (under
     * exactly-once, {@code commit.interval.ms} is 100).
     */
    static Properties config(String bootstrap, String applicationId, Path stateDir, int threads) {
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir.toString());
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        // any other Streams setting, as -Dstreams.NAME=VALUE (e.g. -Dstreams.commit.interval.ms=1000)
        System.getProperties().stringPropertyNames().stream().filter(name -> name.startsWith(PREFIX))
                .forEach(name -> props.put(name.substring(PREFIX.length()), System.getProperty(name)));
        return props;
    }

    /** Run until SIGTERM (closed cleanly, its last transaction committed); exit 1 if the application fails. */
    static void run(Topology topology, Properties config) throws InterruptedException {
        KafkaStreams streams = new KafkaStreams(topology, config);
        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean();
        streams.setUncaughtExceptionHandler(exception -> {
            System.err.println("Kafka Streams failed: " + exception);
            failed.set(true);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.setStateListener((now, before) -> {
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                stopped.countDown();
            }
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            stopped.countDown();
        }, "shutdown"));
        streams.start();
        stopped.await();
        if (failed.get() || streams.state() == KafkaStreams.State.ERROR) {
            Runtime.getRuntime().halt(1);
        }
    }
}
