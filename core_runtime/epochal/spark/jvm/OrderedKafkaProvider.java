package org.epochal.spark;

import java.io.InterruptedIOException;
import java.io.UncheckedIOException;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * Spark's Kafka source ({@code format("kafka")}, same options, same rows), except that every
 * micro-batch lists its input partitions in one order: by topic, Kafka partition and first
 * offset. Its short name is {@value #SHORT_NAME}; only the driver loads it.
 *
 * <p>Spark's Kafka source orders a batch's input partitions (the Spark partitions its tasks
 * read) as the map of the batch's end offsets iterates: a batch planned live takes that map
 * from the broker's answer, the same batch replayed after a failure takes it from the offset
 * log (by partition), and the two orders can differ (for a topic of up to four partitions, often). A
 * replayed batch then reads the same records, but Spark partition {@code i} holds another
 * Kafka partition's records than it did. A sink that commits each Spark partition on its own
 * (epochal's Kafka sink: one Kafka transaction per Spark partition, skipped on a replay when
 * its batch marker is there) would skip records it never wrote and write others twice. Sorted,
 * Spark partition {@code i} of a batch holds the same offset range in every attempt.
 *
 * <p>Everything else is Spark's: the table, scan and stream are Spark's own objects behind
 * {@link Proxy}s that forward every call (so each Spark release keeps the interfaces its Kafka
 * stream implements: admission control, {@code Trigger.AvailableNow}, metrics) and change only
 * the array {@code MicroBatchStream.planInputPartitions} returns.
 */
public class OrderedKafkaProvider implements TableProvider, DataSourceRegister {

  /** The format name: {@code spark.readStream.format("kafka-ordered")}. */
  public static final String SHORT_NAME = "kafka-ordered";

  /** The provider of Spark's Kafka source, which this one delegates to. */
  static final String SPARK_KAFKA_PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider";

  private final TableProvider spark;

  public OrderedKafkaProvider() {
    this.spark = sparkKafkaProvider();
  }

  private static TableProvider sparkKafkaProvider() {
    try {
      Class<?> provider =
          Class.forName(
              SPARK_KAFKA_PROVIDER, true, OrderedKafkaProvider.class.getClassLoader());
      return (TableProvider) provider.getDeclaredConstructor().newInstance();
    } catch (ReflectiveOperationException | LinkageError e) {
      throw new IllegalStateException(
          "format('"
              + SHORT_NAME
              + "') wraps Spark's Kafka source, which is not on the class path: add Spark's "
              + "Kafka connector (spark-sql-kafka-0-10 of this Spark release, e.g. "
              + "--packages org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark version>)",
          e);
    }
  }

  @Override
  public String shortName() {
    return SHORT_NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return spark.inferSchema(options);
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new OrderedKafkaTable(spark.getTable(schema, partitioning, properties));
  }

  @Override
  public boolean supportsExternalMetadata() {
    return spark.supportsExternalMetadata();
  }

  /** Spark's Kafka table, read through a scan whose stream plans partitions in order. */
  public static final class OrderedKafkaTable implements Table, SupportsRead {
    private final Table spark;

    OrderedKafkaTable(Table spark) {
      this.spark = spark;
    }

    @Override
    public String name() {
      return SHORT_NAME;
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
      return spark.schema();
    }

    @Override
    public Transform[] partitioning() {
      return spark.partitioning();
    }

    @Override
    public Map<String, String> properties() {
      return spark.properties();
    }

    @Override
    public Set<TableCapability> capabilities() {
      Set<TableCapability> read = new LinkedHashSet<>(spark.capabilities());
      read.retainAll(
          Set.of(TableCapability.MICRO_BATCH_READ, TableCapability.BATCH_READ));
      return read;
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      ScanBuilder builder = ((SupportsRead) spark).newScanBuilder(options);
      return forward(builder, ScanBuilder.class, "build", OrderedKafkaProvider::orderedScan);
    }
  }

  private static Object orderedScan(Object scan) {
    return forward(
        scan,
        org.apache.spark.sql.connector.read.Scan.class,
        "toMicroBatchStream",
        OrderedKafkaProvider::orderedStream);
  }

  private static Object orderedStream(Object stream) {
    return forward(
        stream,
        org.apache.spark.sql.connector.read.streaming.MicroBatchStream.class,
        "planInputPartitions",
        OrderedKafkaProvider::inOrder);
  }

  /** The input partitions by topic, Kafka partition and first offset. */
  static Object inOrder(Object planned) {
    InputPartition[] partitions = (InputPartition[]) planned;
    List<Placed> placed = new ArrayList<>(partitions.length);
    for (InputPartition partition : partitions) {
      placed.add(new Placed(range(partition), partition));
    }
    placed.sort(Comparator.comparing(Placed::range, BY_PLACE));
    InputPartition[] ordered = new InputPartition[partitions.length];
    for (int i = 0; i < ordered.length; i++) {
      ordered[i] = placed.get(i).partition();
    }
    return ordered;
  }

  /** An input partition with where it reads, read once. */
  record Placed(Range range, InputPartition partition) {}

  /** By topic, Kafka partition and first offset. */
  static final Comparator<Range> BY_PLACE =
      Comparator.comparing(Range::topic)
          .thenComparingInt(Range::partition)
          .thenComparingLong(Range::fromOffset);

  /** Where an input partition of Spark's Kafka source reads. */
  record Range(String topic, int partition, long fromOffset) {}

  static Range range(InputPartition partition) {
    try {
      Object range = partition.getClass().getMethod("offsetRange").invoke(partition);
      Object topicPartition = range.getClass().getMethod("topicPartition").invoke(range);
      String topic = (String) topicPartition.getClass().getMethod("topic").invoke(topicPartition);
      int kafkaPartition =
          (Integer) topicPartition.getClass().getMethod("partition").invoke(topicPartition);
      long from = (Long) range.getClass().getMethod("fromOffset").invoke(range);
      return new Range(topic, kafkaPartition, from);
    } catch (ReflectiveOperationException | ClassCastException e) {
      throw new IllegalStateException(
          "format('"
              + SHORT_NAME
              + "') cannot read the offset range of "
              + partition.getClass().getName()
              + ": this Spark release's Kafka source is not one it knows; use format('kafka') "
              + "and route the rows by key before a sink that settles each Spark partition",
          e);
    }
  }

  /** What one forwarded method's result becomes. */
  interface Change {
    Object apply(Object result);
  }

  /**
   * {@code target} behind a proxy of every interface its class implements, that forwards every
   * call and passes the result of method {@code name} through {@code change}.
   */
  @SuppressWarnings("unchecked")
  static <T> T forward(Object target, Class<T> kind, String name, Change change) {
    Set<Class<?>> interfaces = new LinkedHashSet<>();
    for (Class<?> c = target.getClass(); c != null; c = c.getSuperclass()) {
      collect(c, interfaces);
    }
    if (!interfaces.contains(kind)) {
      throw new IllegalStateException(target.getClass().getName() + " is not a " + kind.getName());
    }
    InvocationHandler handler =
        (proxy, method, args) -> {
          Object result = call(target, method, args);
          return method.getName().equals(name) ? change.apply(result) : result;
        };
    return (T)
        Proxy.newProxyInstance(
            target.getClass().getClassLoader(), interfaces.toArray(new Class<?>[0]), handler);
  }

  private static void collect(Class<?> type, Set<Class<?>> into) {
    for (Class<?> i : type.getInterfaces()) {
      if (into.add(i)) {
        collect(i, into);
      }
    }
  }

  /**
   * {@code method} on {@code target}. What it throws is thrown as it is, except that an
   * {@link InterruptedException} (Spark's Kafka source, written in Scala, throws it from
   * methods that do not declare it: a query stopped while it asks the broker for offsets)
   * becomes an {@link UncheckedIOException} of an {@link InterruptedIOException}: a proxy
   * would wrap the undeclared exception in an {@code UndeclaredThrowableException}, which Spark
   * does not see as an interruption, so a stopped query would end with an error; this one
   * Spark unwraps and takes as the stop it is.
   */
  private static Object call(Object target, Method method, Object[] args) throws Throwable {
    try {
      return method.invoke(target, args);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      if (cause instanceof InterruptedException) {
        InterruptedIOException interrupted = new InterruptedIOException(cause.getMessage());
        interrupted.initCause(cause);
        throw new UncheckedIOException(interrupted);
      }
      throw cause;
    }
  }
}
