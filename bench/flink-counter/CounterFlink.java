// weir's `counter` job written for Apache Flink 2.3's DataStream API, so that
// bench/flink-counter.sh can run the same work on Flink and on weir, on this machine, in one
// sitting: a sequence of event indices, event i belonging to user i mod USERS, keyed by user,
// a value-state count per user (Flink's default heap backend), every (user, count) to a
// discarding sink. Checkpointing is off, as in weir's run.
//
// Usage: java -cp "CounterFlink.jar:$FLINK_HOME/lib/*" CounterFlink EVENTS USERS PARALLELISM
// Prints `flink counter p=P events=N users=U net_runtime_ms=T`: the job's net runtime, JVM and
// MiniCluster start-up left out.
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeHint;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

public class CounterFlink {
    /** The running count per user, in value state. */
    public static class CountPerUser extends KeyedProcessFunction<Long, Tuple2<Long, Long>, Tuple2<Long, Long>> {
        private transient ValueState<Long> count;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext context) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Long.class));
        }

        @Override
        public void processElement(Tuple2<Long, Long> event, Context ctx, Collector<Tuple2<Long, Long>> out)
                throws Exception {
            Long n = count.value();
            long next = (n == null ? 0 : n) + 1;
            count.update(next);
            out.collect(Tuple2.of(event.f1, next));
        }
    }

    public static void main(String[] args) throws Exception {
        long events = Long.parseLong(args[0]);
        long users = Long.parseLong(args[1]);
        int parallelism = Integer.parseInt(args[2]);
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(new Configuration());
        env.setParallelism(parallelism);
        env.fromSequence(0, events - 1)
                .map(index -> Tuple2.of(index, index % users))
                .returns(new TypeHint<Tuple2<Long, Long>>() {})
                .keyBy(event -> event.f1)
                .process(new CountPerUser())
                .returns(new TypeHint<Tuple2<Long, Long>>() {})
                .sinkTo(new DiscardingSink<>());
        JobExecutionResult result = env.execute("counter");
        System.out.println("flink counter p=" + parallelism + " events=" + events + " users=" + users
                + " net_runtime_ms=" + result.getNetRuntime());
    }
}
