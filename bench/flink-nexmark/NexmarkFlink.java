// weir's Nexmark queries (q0, q1, q2, q3, q4, q5, q7, q8, q11) written for Apache Flink 2.3's DataStream API,
// over a port of weir's Nexmark generator (crates/weir-jobs/src/nexmark/model.rs: the same
// event for the same index, the same proportions and event times), so that
// bench/flink-nexmark.sh can run the same work on Flink and on weir, on this machine, in one
// sitting. Flink's own Nexmark project (SQL over its own generator) is not installable here.
//
// Usage: java -cp "NexmarkFlink.jar:$FLINK_HOME/lib/*" NexmarkFlink QUERY EVENTS PARALLELISM [count]
// Prints `flink QUERY p=P events=N net_runtime_ms=T` (output discarded), or with `count` the
// number of result rows, to compare with weir's.
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeHint;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.co.KeyedCoProcessFunction;
import org.apache.flink.streaming.api.windowing.assigners.EventTimeSessionWindows;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.SlidingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;

public class NexmarkFlink {
    // ---------------------------------------------------------------- the model (POJOs)

    public static class Person {
        public long id;
        public String name;
        public String emailAddress;
        public String creditCard;
        public String city;
        public String state;
        public long dateTime;
        public Person() {}
    }

    public static class Auction {
        public long id;
        public String itemName;
        public long initialBid;
        public long reserve;
        public long dateTime;
        public long expires;
        public long seller;
        public long category;
        public Auction() {}
    }

    public static class Bid {
        public long auction;
        public long bidder;
        public long price;
        public String channel;
        public String url;
        public long dateTime;
        public Bid() {}
    }

    /** One event: exactly one of the three is set. */
    public static class Event {
        public Person person;
        public Auction auction;
        public Bid bid;
        public Event() {}

        long dateTime() {
            return person != null ? person.dateTime : auction != null ? auction.dateTime : bid.dateTime;
        }
    }

    // ---------------------------------------------------------------- the generator

    static final long PERSON_PROPORTION = 1, AUCTION_PROPORTION = 3, TOTAL_PROPORTION = 50;
    static final long FIRST_ID = 1000, FIRST_CATEGORY = 10, CATEGORIES = 5;
    static final long BASE_TIME_MS = 1_735_689_600_000L, EVENTS_PER_MS = 10;
    static final long ACTIVE_AUCTIONS = 100, ACTIVE_PEOPLE = 1000;
    static final long HOT_AUCTION_PERCENT = 50, HOT_BIDDER_PERCENT = 25, HOT_SELLER_PERCENT = 25;
    static final String[] FIRST_NAMES = {"Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"};
    static final String[] LAST_NAMES = {"Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"};
    static final String[] CITIES = {"Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"};
    static final String[] STATES = {"AZ", "CA", "ID", "OR", "WA", "WY"};
    static final String[] CHANNELS = {"Google", "Facebook", "Baidu", "Apple"};
    static final String[] URLS = {
        "https://www.nexmark.com/item.htm?query=1",
        "https://www.nexmark.com/item.htm?query=2&channel_id=1",
        "https://www.nexmark.com/search.htm?query=3",
        "https://www.nexmark.com/bid.htm?query=4&channel_id=2",
    };
    static final int PRICE_STEPS = 6_000;
    static final long[] PRICES = new long[PRICE_STEPS];
    static {
        for (int i = 0; i < PRICE_STEPS; i++) PRICES[i] = Math.round(Math.pow(10, i / 1000.0) * 100.0);
    }

    /** splitmix64, as weir's generator. */
    static final class Random {
        long state;
        Random(long seed) { state = seed; }
        long next() {
            state += 0x9E3779B97F4A7C15L;
            long z = state;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            return z ^ (z >>> 31);
        }
        long below(long bound) { return bound == 0 ? 0 : Long.remainderUnsigned(next(), bound); }
    }

    static long lastPerson(long n) { return n / TOTAL_PROPORTION * PERSON_PROPORTION; }

    static long lastAuction(long n) {
        long epoch = n / TOTAL_PROPORTION, offset = n % TOTAL_PROPORTION;
        if (offset < PERSON_PROPORTION) return Math.max(epoch * AUCTION_PROPORTION - 1, 0);
        offset = Math.min(offset - PERSON_PROPORTION, AUCTION_PROPORTION - 1);
        return epoch * AUCTION_PROPORTION + offset;
    }

    static long recentPerson(Random random, long n, long hotPercent) {
        long newest = lastPerson(n);
        if (random.below(100) < hotPercent) return FIRST_ID + (newest / 4) * 4;
        long oldest = Math.max(newest - ACTIVE_PEOPLE, 0);
        return FIRST_ID + oldest + random.below(newest - oldest + 1);
    }

    static Event generate(long n) {
        Random random = new Random(n ^ 0x5EED1E5500000000L);
        long dateTime = BASE_TIME_MS + n / EVENTS_PER_MS;
        long offset = n % TOTAL_PROPORTION;
        Event event = new Event();
        if (offset < PERSON_PROPORTION) {
            Person p = new Person();
            p.id = FIRST_ID + lastPerson(n);
            String first = FIRST_NAMES[(int) random.below(FIRST_NAMES.length)];
            String last = LAST_NAMES[(int) random.below(LAST_NAMES.length)];
            p.city = CITIES[(int) random.below(CITIES.length)];
            p.state = STATES[(int) random.below(STATES.length)];
            p.name = first + " " + last;
            p.emailAddress = first.toLowerCase() + "@" + last.toLowerCase() + ".com";
            p.creditCard = String.format("%04d %04d %04d %04d", random.below(10_000), random.below(10_000), random.below(10_000), random.below(10_000));
            p.dateTime = dateTime;
            event.person = p;
            return event;
        }
        if (offset < PERSON_PROPORTION + AUCTION_PROPORTION) {
            Auction a = new Auction();
            a.id = FIRST_ID + lastAuction(n);
            a.initialBid = 100 + random.below(10_000);
            a.itemName = "item-" + random.below(100_000);
            a.reserve = a.initialBid + random.below(10_000);
            a.dateTime = dateTime;
            a.expires = dateTime + 1_000 + random.below(20_000);
            a.seller = recentPerson(random, n, HOT_SELLER_PERCENT);
            a.category = FIRST_CATEGORY + random.below(CATEGORIES);
            event.auction = a;
            return event;
        }
        long newest = lastAuction(n);
        Bid b = new Bid();
        if (random.below(100) < HOT_AUCTION_PERCENT) {
            b.auction = FIRST_ID + (newest / 2) * 2;
        } else {
            long oldest = Math.max(newest - ACTIVE_AUCTIONS, 0);
            b.auction = FIRST_ID + oldest + random.below(newest - oldest + 1);
        }
        b.price = PRICES[(int) random.below(PRICE_STEPS)];
        b.bidder = recentPerson(random, n, HOT_BIDDER_PERCENT);
        b.channel = CHANNELS[(int) random.below(CHANNELS.length)];
        b.url = URLS[(int) random.below(URLS.length)];
        b.dateTime = dateTime;
        event.bid = b;
        return event;
    }

    // ---------------------------------------------------------------- the queries

    /** Counts a window's bids. */
    public static class Count implements AggregateFunction<Bid, Long, Long> {
        public Long createAccumulator() { return 0L; }
        public Long add(Bid bid, Long acc) { return acc + 1; }
        public Long getResult(Long acc) { return acc; }
        public Long merge(Long a, Long b) { return a + b; }
    }

    /** The highest price of a window's bids and its bidders and times. */
    public static class TopBids {
        public long price;
        public long[] bidders = new long[0];
        public long[] times = new long[0];
        public TopBids() {}
    }

    public static class HighestBids implements AggregateFunction<Bid, TopBids, TopBids> {
        public TopBids createAccumulator() { return new TopBids(); }
        public TopBids add(Bid bid, TopBids acc) {
            if (bid.price > acc.price || acc.bidders.length == 0) {
                acc.price = bid.price;
                acc.bidders = new long[0];
                acc.times = new long[0];
            }
            if (bid.price == acc.price) {
                acc.bidders = java.util.Arrays.copyOf(acc.bidders, acc.bidders.length + 1);
                acc.times = java.util.Arrays.copyOf(acc.times, acc.times.length + 1);
                acc.bidders[acc.bidders.length - 1] = bid.bidder;
                acc.times[acc.times.length - 1] = bid.dateTime;
            }
            return acc;
        }
        public TopBids getResult(TopBids acc) { return acc; }
        public TopBids merge(TopBids a, TopBids b) { return a.price >= b.price ? a : b; }
    }

    /** Tags a per-auction window result with the window's end and the auction. */
    public static class WithWindowEnd<V> extends ProcessWindowFunction<V, Tuple3<Long, Long, V>, Long, TimeWindow> {
        public void process(Long auction, Context context, Iterable<V> values, Collector<Tuple3<Long, Long, V>> out) {
            for (V v : values) out.collect(Tuple3.of(context.window().getEnd(), auction, v));
        }
    }

    /** Per window end, the rows with the largest value, once the watermark passes it. */
    public abstract static class MaxPerWindow<V, R> extends KeyedProcessFunction<Long, Tuple3<Long, Long, V>, R> {
        transient ListState<Tuple2<Long, V>> rows;
        abstract TypeInformation<Tuple2<Long, V>> rowType();
        abstract long valueOf(V v);
        abstract void emit(long windowEnd, long auction, V v, Collector<R> out);

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext context) {
            rows = getRuntimeContext().getListState(new ListStateDescriptor<>("window-rows", rowType()));
        }

        @Override
        public void processElement(Tuple3<Long, Long, V> row, Context ctx, Collector<R> out) throws Exception {
            rows.add(Tuple2.of(row.f1, row.f2));
            ctx.timerService().registerEventTimeTimer(row.f0 - 1);
        }

        @Override
        public void onTimer(long timestamp, OnTimerContext ctx, Collector<R> out) throws Exception {
            List<Tuple2<Long, V>> all = new ArrayList<>();
            for (Tuple2<Long, V> r : rows.get()) all.add(r);
            rows.clear();
            long max = Long.MIN_VALUE;
            for (Tuple2<Long, V> r : all) max = Math.max(max, valueOf(r.f1));
            for (Tuple2<Long, V> r : all) if (valueOf(r.f1) == max) emit(ctx.getCurrentKey(), r.f0, r.f1, out);
        }
    }

    public static class HotItems extends MaxPerWindow<Long, Tuple3<Long, Long, Long>> {
        TypeInformation<Tuple2<Long, Long>> rowType() { return TypeInformation.of(new TypeHint<Tuple2<Long, Long>>() {}); }
        long valueOf(Long count) { return count; }
        void emit(long windowEnd, long auction, Long count, Collector<Tuple3<Long, Long, Long>> out) {
            out.collect(Tuple3.of(windowEnd, auction, count));
        }
    }

    public static class HighestBid extends MaxPerWindow<TopBids, Tuple3<Long, Long, Long>> {
        TypeInformation<Tuple2<Long, TopBids>> rowType() { return TypeInformation.of(new TypeHint<Tuple2<Long, TopBids>>() {}); }
        long valueOf(TopBids top) { return top.price; }
        void emit(long windowEnd, long auction, TopBids top, Collector<Tuple3<Long, Long, Long>> out) {
            for (long bidder : top.bidders) out.collect(Tuple3.of(windowEnd, auction, bidder));
        }
    }

    /** q3: people in OR, ID or CA joined with their category-10 auctions. */
    public static class Q3Join extends KeyedCoProcessFunction<Long, Person, Auction, String> {
        transient ValueState<Person> person;
        transient ListState<Long> pending;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext context) {
            person = getRuntimeContext().getState(new ValueStateDescriptor<>("person", Person.class));
            pending = getRuntimeContext().getListState(new ListStateDescriptor<>("pending-auctions", Long.class));
        }

        @Override
        public void processElement1(Person p, Context ctx, Collector<String> out) throws Exception {
            for (Long auction : pending.get()) out.collect(p.name + "\t" + p.city + "\t" + p.state + "\t" + auction);
            pending.clear();
            person.update(p);
        }

        @Override
        public void processElement2(Auction a, Context ctx, Collector<String> out) throws Exception {
            Person p = person.value();
            if (p != null) out.collect(p.name + "\t" + p.city + "\t" + p.state + "\t" + a.id);
            else pending.add(a.id);
        }
    }

    /** What q4's first stage keeps of one auction: open (its window, category and best bid so far), or closed. */
    public static class AuctionBook {
        public long opened;
        public long expires;
        public long category;
        public long best;
        public boolean hasBest;
        public boolean closed;
        public AuctionBook() {}
    }

    /**
     * q4's first stage: each auction's winning bid, emitted as (category, price) at expiry. One
     * state per auction (looked up once per bid), and the bids that came before their auction.
     */
    public static class WinningBid extends KeyedCoProcessFunction<Long, Auction, Bid, Tuple2<Long, Long>> {
        transient ValueState<AuctionBook> book;
        transient ListState<Tuple2<Long, Long>> early;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext context) {
            book = getRuntimeContext().getState(new ValueStateDescriptor<>("auction-book", AuctionBook.class));
            early = getRuntimeContext().getListState(new ListStateDescriptor<>("early-bids",
                    TypeInformation.of(new TypeHint<Tuple2<Long, Long>>() {})));
        }

        static void offer(AuctionBook b, long at, long price) {
            if (b.opened <= at && at <= b.expires) {
                b.best = b.hasBest ? Math.max(b.best, price) : price;
                b.hasBest = true;
            }
        }

        @Override
        public void processElement1(Auction a, Context ctx, Collector<Tuple2<Long, Long>> out) throws Exception {
            AuctionBook b = new AuctionBook();
            b.opened = a.dateTime;
            b.expires = a.expires;
            b.category = a.category;
            for (Tuple2<Long, Long> bid : early.get()) offer(b, bid.f0, bid.f1);
            early.clear();
            book.update(b);
            ctx.timerService().registerEventTimeTimer(a.expires);
        }

        @Override
        public void processElement2(Bid bid, Context ctx, Collector<Tuple2<Long, Long>> out) throws Exception {
            AuctionBook b = book.value();
            if (b == null) {
                early.add(Tuple2.of(bid.dateTime, bid.price));
            } else if (!b.closed && b.opened <= bid.dateTime && bid.dateTime <= b.expires) {
                offer(b, bid.dateTime, bid.price);
                book.update(b);
            }
        }

        @Override
        public void onTimer(long timestamp, OnTimerContext ctx, Collector<Tuple2<Long, Long>> out) throws Exception {
            AuctionBook b = book.value();
            if (b == null || b.closed) return;
            if (b.hasBest) out.collect(Tuple2.of(b.category, b.best));
            AuctionBook closed = new AuctionBook();
            closed.closed = true;
            book.update(closed);
        }
    }

    /** q4's second stage: the running average winning price per category. */
    public static class AveragePerCategory extends KeyedProcessFunction<Long, Tuple2<Long, Long>, String> {
        transient ValueState<Tuple2<Long, Long>> totals;

        @Override
        public void open(org.apache.flink.api.common.functions.OpenContext context) {
            totals = getRuntimeContext().getState(new ValueStateDescriptor<>("sum-and-count",
                    TypeInformation.of(new TypeHint<Tuple2<Long, Long>>() {})));
        }

        @Override
        public void processElement(Tuple2<Long, Long> closed, Context ctx, Collector<String> out) throws Exception {
            Tuple2<Long, Long> t = totals.value();
            if (t == null) t = Tuple2.of(0L, 0L);
            t = Tuple2.of(t.f0 + closed.f1, t.f1 + 1);
            totals.update(t);
            out.collect(closed.f0 + "\t" + t.f1 + "\t" + (t.f0 / t.f1));
        }
    }

    /** q11: a session's bid count with the bidder and the session's bounds. */
    public static class SessionRow extends ProcessWindowFunction<Long, String, Long, TimeWindow> {
        public void process(Long bidder, Context context, Iterable<Long> counts, Collector<String> out) {
            for (Long count : counts) out.collect(bidder + "\t" + count + "\t" + context.window().getStart() + "\t" + context.window().getEnd());
        }
    }

    /** q8: the people of a window who opened an auction in it. */
    public static class NewUsers implements org.apache.flink.api.common.functions.CoGroupFunction<Person, Auction, String> {
        public void coGroup(Iterable<Person> people, Iterable<Auction> sold, Collector<String> out) {
            if (sold.iterator().hasNext()) for (Person p : people) out.collect(p.id + "\t" + p.name);
        }
    }

    public static class BidCount implements AggregateFunction<Bid, Long, Long> {
        public Long createAccumulator() { return 0L; }
        public Long add(Bid bid, Long acc) { return acc + 1; }
        public Long getResult(Long acc) { return acc; }
        public Long merge(Long a, Long b) { return a + b; }
    }

    public static void main(String[] args) throws Exception {
        String query = args[0];
        long events = Long.parseLong(args[1]);
        int parallelism = Integer.parseInt(args[2]);
        Configuration conf = new Configuration();
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.setParallelism(parallelism);
        DataStream<Event> all = env.fromSequence(0, events - 1)
                .map(NexmarkFlink::generate)
                .returns(Event.class)
                .assignTimestampsAndWatermarks(WatermarkStrategy.<Event>forMonotonousTimestamps()
                        .withTimestampAssigner((e, ts) -> e.dateTime())
                        .withIdleness(Duration.ofSeconds(1)));
        DataStream<Bid> bids = all
                .flatMap((Event e, Collector<Bid> out) -> { if (e.bid != null) out.collect(e.bid); })
                .returns(Bid.class);
        DataStream<Person> persons = all
                .flatMap((Event e, Collector<Person> out) -> { if (e.person != null) out.collect(e.person); })
                .returns(Person.class);
        DataStream<Auction> auctions = all
                .flatMap((Event e, Collector<Auction> out) -> { if (e.auction != null) out.collect(e.auction); })
                .returns(Auction.class);
        DataStream<?> results = switch (query) {
            case "q0" -> bids.map(b -> b).returns(Bid.class);
            case "q1" -> bids.map(b -> { b.price = b.price * 908 / 1000; return b; }).returns(Bid.class);
            case "q2" -> bids.filter(b -> b.auction % 123 == 0)
                    .map(b -> Tuple2.of(b.auction, b.price)).returns(new TypeHint<Tuple2<Long, Long>>() {});
            case "q5" -> bids.keyBy(b -> b.auction)
                    .window(SlidingEventTimeWindows.of(Duration.ofSeconds(10), Duration.ofSeconds(2)))
                    .aggregate(new Count(), new WithWindowEnd<Long>(), TypeInformation.of(Long.class),
                            TypeInformation.of(Long.class), new TypeHint<Tuple3<Long, Long, Long>>() {}.getTypeInfo())
                    .keyBy(r -> r.f0)
                    .process(new HotItems()).returns(new TypeHint<Tuple3<Long, Long, Long>>() {});
            case "q7" -> bids.keyBy(b -> b.auction)
                    .window(TumblingEventTimeWindows.of(Duration.ofSeconds(10)))
                    .aggregate(new HighestBids(), new WithWindowEnd<TopBids>(), TypeInformation.of(TopBids.class),
                            TypeInformation.of(TopBids.class), new TypeHint<Tuple3<Long, Long, TopBids>>() {}.getTypeInfo())
                    .keyBy(r -> r.f0)
                    .process(new HighestBid()).returns(new TypeHint<Tuple3<Long, Long, Long>>() {});
            case "q3" -> persons.filter(p -> p.state.equals("OR") || p.state.equals("ID") || p.state.equals("CA"))
                    .keyBy(p -> p.id)
                    .connect(auctions.filter(a -> a.category == 10).keyBy(a -> a.seller))
                    .process(new Q3Join()).returns(String.class);
            case "q4" -> auctions.keyBy(a -> a.id)
                    .connect(bids.keyBy(b -> b.auction))
                    .process(new WinningBid()).returns(new TypeHint<Tuple2<Long, Long>>() {})
                    .keyBy(c -> c.f0)
                    .process(new AveragePerCategory()).returns(String.class);
            case "q8" -> persons.coGroup(auctions)
                    .where(p -> p.id).equalTo(a -> a.seller)
                    .window(TumblingEventTimeWindows.of(Duration.ofSeconds(10)))
                    .apply(new NewUsers(), TypeInformation.of(String.class));
            case "q11" -> bids.keyBy(b -> b.bidder)
                    .window(EventTimeSessionWindows.withGap(Duration.ofSeconds(10)))
                    .aggregate(new BidCount(), new SessionRow(), TypeInformation.of(Long.class),
                            TypeInformation.of(Long.class), TypeInformation.of(String.class));
            default -> throw new IllegalArgumentException("query " + query + " is not one of q0, q1, q2, q3, q4, q5, q7, q8, q11");
        };
        if (args.length > 3 && args[3].equals("count")) {
            // A parity check against weir's output: the number of result rows.
            long rows = 0;
            try (var it = results.executeAndCollect()) {
                while (it.hasNext()) { it.next(); rows++; }
            }
            System.out.println("flink " + query + " rows=" + rows);
            return;
        }
        results.sinkTo(new DiscardingSink<>());
        JobExecutionResult result = env.execute("nexmark " + query);
        System.out.println("flink " + query + " p=" + parallelism + " events=" + events + " net_runtime_ms=" + result.getNetRuntime());
    }
}
