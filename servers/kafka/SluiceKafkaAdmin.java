/*
 * Topic administration and an independent client for Sluice's Kafka tests, on the broker's own
 * jars (kafka-clients is one of them): the CLI tools (TopicCommand, ConsoleConsumer, ...) are not
 * in kafka_2.13 but in kafka-tools, 43 MB more. `run admin` compiles this once into its cache and
 * runs it:
 *
 *   SluiceKafkaAdmin <bootstrap> create-topic <name> <partitions> [key=value ...]
 *       Creates the topic (replication factor 1, the key=value topic configs) and waits until
 *       every partition has a leader.
 *   SluiceKafkaAdmin <bootstrap> describe-topic <name>
 *       One line per partition: <partition> <leader or -1> <end offset>. Exit status 3 when
 *       there is no such topic.
 *   SluiceKafkaAdmin <bootstrap> list-topics
 *       The names of the topics that are not internal, one a line, sorted.
 *   SluiceKafkaAdmin <bootstrap> consume <topic> <expected> <timeout ms>
 *       Reads the topic from its beginning (all partitions, no consumer group, read_uncommitted)
 *       until <expected> records were read or the time is up, then on to the end offsets of that
 *       moment, so that duplicates beyond <expected> show. One line per record:
 *       <partition> <offset> <key hex or -> <value hex or ->.
 *   SluiceKafkaAdmin <bootstrap> produce <topic>
 *       Sends one record per line of stdin, <partition or -> <key hex or -> <value hex or ->,
 *       with acks=all and idempotence, and flushes before it exits.
 *
 * Failures go to stderr as one line "SluiceKafkaAdmin: <reason>", with exit status 1 (2 for
 * usage errors).
 */

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

import java.io.BufferedReader;
import java.io.BufferedWriter;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

public final class SluiceKafkaAdmin {
    private static final long CALL_TIMEOUT_MS = 30_000;

    public static void main(String[] args) {
        try {
            System.exit(run(args));
        } catch (ExecutionException e) {
            fail(e.getCause() != null ? e.getCause() : e);
        } catch (Throwable e) {
            fail(e);
        }
    }

    private static void fail(Throwable e) {
        System.err.println("SluiceKafkaAdmin: " + e.getClass().getSimpleName() + ": " + e.getMessage());
        System.exit(1);
    }

    private static int usage() {
        System.err.println("SluiceKafkaAdmin: usage: <bootstrap> create-topic <name> <partitions> [key=value ...]"
                + " | describe-topic <name> | list-topics | consume <topic> <expected> <timeout ms> | produce <topic>");
        return 2;
    }

    private static int run(String[] args) throws Exception {
        if (args.length < 2) return usage();
        String bootstrap = args[0];
        switch (args[1]) {
            case "create-topic":
                if (args.length < 4) return usage();
                return createTopic(bootstrap, args[2], Integer.parseInt(args[3]), args);
            case "describe-topic":
                if (args.length != 3) return usage();
                return describeTopic(bootstrap, args[2]);
            case "list-topics":
                if (args.length != 2) return usage();
                return listTopics(bootstrap);
            case "consume":
                if (args.length != 5) return usage();
                return consume(bootstrap, args[2], Long.parseLong(args[3]), Long.parseLong(args[4]));
            case "produce":
                if (args.length != 3) return usage();
                return produce(bootstrap, args[2]);
            default:
                return usage();
        }
    }

    private static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, "sluice-test-admin");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, (int) CALL_TIMEOUT_MS);
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, 10_000);
        return Admin.create(p);
    }

    private static int createTopic(String bootstrap, String name, int partitions, String[] args) throws Exception {
        Map<String, String> configs = new HashMap<>();
        for (int i = 4; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq <= 0) return usage();
            configs.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        try (Admin admin = admin(bootstrap)) {
            NewTopic topic = new NewTopic(name, partitions, (short) 1).configs(configs);
            admin.createTopics(List.of(topic)).all().get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS);
            // Created is not yet led: wait until every partition has a leader, so that a client
            // started next does not see "leader not available".
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(CALL_TIMEOUT_MS);
            while (true) {
                try {
                    TopicDescription d = admin.describeTopics(List.of(name)).allTopicNames()
                            .get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS).get(name);
                    if (d.partitions().size() == partitions
                            && d.partitions().stream().allMatch(p -> p.leader() != null && !p.leader().isEmpty())) {
                        return 0;
                    }
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) throw e;
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException("topic " + name + " was created but its partitions have no leader after "
                            + CALL_TIMEOUT_MS + " ms");
                }
                Thread.sleep(20);
            }
        }
    }

    private static int describeTopic(String bootstrap, String name) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            TopicDescription d;
            try {
                d = admin.describeTopics(List.of(name)).allTopicNames().get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS).get(name);
            } catch (ExecutionException e) {
                if (e.getCause() instanceof UnknownTopicOrPartitionException) return 3;
                throw e;
            }
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            for (TopicPartitionInfo p : d.partitions()) latest.put(new TopicPartition(name, p.partition()), OffsetSpec.latest());
            var ends = admin.listOffsets(latest).all().get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS);
            StringBuilder out = new StringBuilder();
            for (TopicPartitionInfo p : d.partitions()) {
                int leader = p.leader() == null || p.leader().isEmpty() ? -1 : p.leader().id();
                long end = ends.get(new TopicPartition(name, p.partition())).offset();
                out.append(p.partition()).append(' ').append(leader).append(' ').append(end).append('\n');
            }
            System.out.print(out);
            System.out.flush();
            return 0;
        }
    }

    private static int listTopics(String bootstrap) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            for (String name : new TreeSet<>(admin.listTopics().names().get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS))) {
                System.out.println(name);
            }
            return 0;
        }
    }

    private static int consume(String bootstrap, String topic, long expected, long timeoutMs) throws Exception {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "sluice-test-consumer");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        // An empty poll returns after 100 ms rather than 500: the end of the topic shows sooner.
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        BufferedWriter out = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.US_ASCII), 1 << 16);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            consumer.partitionsFor(topic, Duration.ofMillis(timeoutMs))
                    .forEach(i -> parts.add(new TopicPartition(topic, i.partition())));
            if (parts.isEmpty()) throw new UnknownTopicOrPartitionException("no topic " + topic);
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long count = 0;
            while (count < expected && System.nanoTime() < deadline) {
                count += write(out, consumer.poll(Duration.ofMillis(100)));
            }
            // Then on to the end offsets of now: records beyond the expected ones show too.
            Map<TopicPartition, Long> ends = consumer.endOffsets(parts, Duration.ofMillis(CALL_TIMEOUT_MS));
            while (System.nanoTime() < deadline && parts.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                write(out, consumer.poll(Duration.ofMillis(100)));
            }
        }
        out.flush();
        return 0;
    }

    private static long write(BufferedWriter out, Iterable<ConsumerRecord<byte[], byte[]>> records) throws Exception {
        long n = 0;
        for (ConsumerRecord<byte[], byte[]> r : records) {
            out.write(Integer.toString(r.partition()));
            out.write(' ');
            out.write(Long.toString(r.offset()));
            out.write(' ');
            out.write(hex(r.key()));
            out.write(' ');
            out.write(hex(r.value()));
            out.write('\n');
            n++;
        }
        return n;
    }

    private static int produce(String bootstrap, String topic) throws Exception {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "sluice-test-producer");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII), 1 << 16);
        List<Future<?>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            String line;
            int lineNo = 0;
            while ((line = in.readLine()) != null) {
                lineNo++;
                if (line.isEmpty()) continue;
                String[] f = line.split(" ", -1);
                if (f.length != 3) throw new IllegalArgumentException("line " + lineNo + " is not <partition> <key> <value>");
                Integer partition = f[0].equals("-") ? null : Integer.valueOf(f[0]);
                sent.add(producer.send(new ProducerRecord<>(topic, partition, unhex(f[1]), unhex(f[2]))));
            }
            producer.flush();
            for (Future<?> f : sent) f.get(CALL_TIMEOUT_MS, TimeUnit.MILLISECONDS);
        }
        return 0;
    }

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private static String hex(byte[] bytes) {
        if (bytes == null) return "-";
        char[] c = new char[bytes.length * 2];
        for (int i = 0; i < bytes.length; i++) {
            c[2 * i] = HEX[(bytes[i] >> 4) & 0xf];
            c[2 * i + 1] = HEX[bytes[i] & 0xf];
        }
        return new String(c);
    }

    private static byte[] unhex(String s) {
        if (s.equals("-")) return null;
        if (s.length() % 2 != 0) throw new IllegalArgumentException("odd-length hex: " + s);
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return b;
    }
}
