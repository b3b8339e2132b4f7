//! The Nexmark queries as weir pipelines over the event stream. Each query's output is one
//! tab-separated line per result row; docs/event-time.md names the columns.

use std::time::Duration;

use std::fmt::Write as _;

use weir_api::catalog::{JobArgs, JobBuildError};
use weir_api::prelude::*;

use crate::output::Output;

use super::model::{Auction, Bid, Event, Person};

/// q1's exchange rate, per mille (dollars to euros, as Nexmark's 0.908).
const EURO_PER_MILLE: u64 = 908;
/// q2 keeps bids on auctions whose id is a multiple of this.
const Q2_AUCTION_MODULUS: u64 = 123;
/// q5's sliding window and q7's and q8's tumbling windows.
const Q5_SIZE: Duration = Duration::from_secs(10);
const Q5_SLIDE: Duration = Duration::from_secs(2);
const Q7_Q8_SIZE: Duration = Duration::from_secs(10);

fn bids(events: &DataStream<Event>) -> DataStream<Bid> {
    events.flat_map(|event: Event, out: &mut Collector<'_, Bid>| {
        if let Event::Bid(bid) = event {
            out.collect(bid);
        }
    })
}

fn persons(events: &DataStream<Event>) -> DataStream<Person> {
    events.flat_map(|event: Event, out: &mut Collector<'_, Person>| {
        if let Event::Person(person) = event {
            out.collect(person);
        }
    })
}

fn auctions(events: &DataStream<Event>) -> DataStream<Auction> {
    events.flat_map(|event: Event, out: &mut Collector<'_, Auction>| {
        if let Event::Auction(auction) = event {
            out.collect(auction);
        }
    })
}

/// q0, pass-through: every bid (`auction bidder price date_time`).
pub fn q0(events: &DataStream<Event>) -> DataStream<Bid> {
    bids(events).map(|b: Bid| b).uid("q0")
}

/// q1, currency conversion: every bid with its price in euros (`auction bidder euro_cents
/// date_time`).
pub fn q1(events: &DataStream<Event>) -> DataStream<Bid> {
    bids(events).map(|b: Bid| Bid { price: b.price * EURO_PER_MILLE / 1000, ..b }).uid("q1")
}

/// q2, selection: bids on auctions whose id is a multiple of 123 (`auction price`).
pub fn q2(events: &DataStream<Event>) -> DataStream<(u64, u64)> {
    bids(events)
        .filter(|b: &Bid| b.auction.is_multiple_of(Q2_AUCTION_MODULUS))
        .map(|b: Bid| (b.auction, b.price))
        .uid("q2")
}

/// q3's states.
const Q3_STATES: [&str; 3] = ["OR", "ID", "CA"];
/// q3's category.
const Q3_CATEGORY: u64 = 10;

/// q3, local item suggestion: people in OR, ID or CA joined with their auctions in category
/// 10 (`name city state auction`), an incremental join keyed by person id.
#[derive(Clone)]
pub struct Q3Join {
    person: ValueState<(String, String, String)>,
    pending: ListState<u64>,
}

impl Default for Q3Join {
    fn default() -> Self {
        Q3Join { person: ValueState::new("person"), pending: ListState::new("pending-auctions") }
    }
}

impl KeyedCoProcessFunction<u64, Person, Auction, String> for Q3Join {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.person.declaration(), self.pending.declaration()]
    }

    fn process_element1(
        &mut self,
        person: Person,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        let pending = ctx.list(&self.pending)?.get().to_vec();
        for auction in pending {
            out.collect(format!("{}\t{}\t{}\t{auction}", person.name, person.city, person.state));
        }
        ctx.list(&self.pending)?.clear();
        ctx.value(&self.person)?.set((person.name, person.city.into_owned(), person.state.into_owned()));
        Ok(())
    }

    fn process_element2(
        &mut self,
        auction: Auction,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        match ctx.value(&self.person)?.get() {
            Some((name, city, state)) => out.collect(format!("{name}\t{city}\t{state}\t{}", auction.id)),
            // The seller's registration is still on its way (another subtask read it).
            None => ctx.list(&self.pending)?.add(auction.id),
        }
        Ok(())
    }
}

/// q3: see [`Q3Join`].
pub fn q3(events: &DataStream<Event>) -> DataStream<String> {
    let people = persons(events).filter(|p: &Person| Q3_STATES.contains(&p.state.as_ref()));
    let sold = auctions(events).filter(|a: &Auction| a.category == Q3_CATEGORY);
    people.key_by(|p: &Person| p.id).connect(&sold.key_by(|a: &Auction| a.seller)).process(Q3Join::default()).uid("q3")
}

/// What q4's first stage keeps of one auction (one state, so a bid costs one lookup).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum AuctionBook {
    /// Open: its window and category, and its best bid in that window so far.
    Open {
        /// When it opened (its event time).
        opened: i64,
        /// When it closes.
        expires: i64,
        /// Its category.
        category: u64,
        /// The highest bid placed while it was open, so far.
        best: Option<u64>,
    },
    /// Closed at its expiry: later bids are dropped.
    Closed,
}

impl AuctionBook {
    /// A bid of `price` placed at `at`: the best one if the auction was open then.
    fn offer(&mut self, at: i64, price: u64) {
        if let AuctionBook::Open { opened, expires, best, .. } = self
            && *opened <= at
            && at <= *expires
        {
            *best = Some(best.map_or(price, |current| current.max(price)));
        }
    }
}

/// q4's first stage: each auction's winning bid (the highest among the bids placed while it
/// was open), emitted as `(category, price)` when it closes (an event-time timer at its
/// expiry).
#[derive(Clone)]
pub struct WinningBid {
    book: ValueState<AuctionBook>,
    early: ListState<(i64, u64)>,
}

impl Default for WinningBid {
    fn default() -> Self {
        WinningBid { book: ValueState::new("auction-book"), early: ListState::new("early-bids") }
    }
}

impl KeyedCoProcessFunction<u64, Auction, Bid, (u64, u64)> for WinningBid {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.book.declaration(), self.early.declaration()]
    }

    fn process_element1(
        &mut self,
        auction: Auction,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, (u64, u64)>,
    ) -> FnResult {
        let mut book = AuctionBook::Open {
            opened: auction.date_time,
            expires: auction.expires,
            category: auction.category,
            best: None,
        };
        let mut early = ctx.list(&self.early)?;
        for (at, price) in early.get() {
            book.offer(*at, *price);
        }
        early.clear();
        ctx.value(&self.book)?.set(book);
        ctx.register_event_time_timer(auction.expires);
        Ok(())
    }

    fn process_element2(
        &mut self,
        bid: Bid,
        ctx: &mut KeyedContext<'_, u64>,
        _out: &mut Collector<'_, (u64, u64)>,
    ) -> FnResult {
        if let Some(book) = ctx.value(&self.book)?.get_mut() {
            book.offer(bid.date_time, bid.price);
            return Ok(());
        }
        // The auction itself is still on its way (another subtask read it).
        ctx.list(&self.early)?.add((bid.date_time, bid.price));
        Ok(())
    }

    fn on_timer(
        &mut self,
        _timestamp: i64,
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, (u64, u64)>,
    ) -> FnResult {
        let mut book = ctx.value(&self.book)?;
        let Some(AuctionBook::Open { category, best, .. }) = book.get().cloned() else { return Ok(()) };
        if let Some(price) = best {
            out.collect((category, price));
        }
        book.set(AuctionBook::Closed);
        Ok(())
    }
}

/// q4's second stage: the running average winning price per category.
#[derive(Clone)]
pub struct AveragePerCategory {
    totals: ValueState<(u64, u64)>,
}

impl Default for AveragePerCategory {
    fn default() -> Self {
        AveragePerCategory { totals: ValueState::new("sum-and-count") }
    }
}

impl KeyedProcessFunction<u64, (u64, u64), String> for AveragePerCategory {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.totals.declaration()]
    }

    fn process_element(
        &mut self,
        closed: (u64, u64),
        ctx: &mut KeyedContext<'_, u64>,
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        let mut totals = ctx.value(&self.totals)?;
        let (sum, count) = totals.get_or_insert_with(|| (0, 0));
        *sum += closed.1;
        *count += 1;
        out.collect(format!("{}\t{}\t{}", closed.0, count, *sum / *count));
        Ok(())
    }
}

/// q4, average price per category: winning bids of closed auctions (a join of auctions and
/// bids, each auction's bids until it expires), then a running average per category
/// (`category closed_auctions average_price`, one line per closed auction).
pub fn q4(events: &DataStream<Event>) -> DataStream<String> {
    let open = auctions(events).key_by(|a: &Auction| a.id);
    let placed = bids(events).key_by(|b: &Bid| b.auction);
    open.connect(&placed)
        .process(WinningBid::default())
        .uid("q4-winning-bids")
        .key_by(|closed: &(u64, u64)| closed.0)
        .process(AveragePerCategory::default())
        .uid("q4")
}

/// Counts records.
#[derive(Clone)]
pub struct Count;

impl<T> AggregateFunction<T, u64, u64> for Count {
    fn create_accumulator(&self) -> u64 {
        0
    }
    fn add(&self, _value: T, acc: u64) -> u64 {
        acc + 1
    }
    fn get_result(&self, acc: &u64) -> u64 {
        *acc
    }
    fn merge(&self, a: u64, b: u64) -> u64 {
        a + b
    }
}

/// Tags a per-key window result with its key and window end.
#[derive(Clone)]
pub struct WithWindowEnd;

impl<V: Clone> ProcessWindowFunction<u64, V, (i64, u64, V)> for WithWindowEnd {
    fn process(
        &mut self,
        key: &u64,
        context: &WindowContext<'_>,
        elements: &[V],
        out: &mut Collector<'_, (i64, u64, V)>,
    ) -> FnResult {
        for value in elements {
            out.collect((context.window.end, *key, value.clone()));
        }
        Ok(())
    }
}

/// Per window end: the rows whose value is the window's largest, emitted by `emit` once the
/// watermark passes the window.
pub struct MaxPerWindow<V, R> {
    rows: ListState<(u64, V)>,
    value_of: fn(&V) -> u64,
    emit: fn(i64, u64, &V, &mut Collector<'_, R>),
}

impl<V, R> Clone for MaxPerWindow<V, R> {
    fn clone(&self) -> Self {
        MaxPerWindow { rows: self.rows.clone(), value_of: self.value_of, emit: self.emit }
    }
}

impl<V: weir_api::Data + Sync, R> MaxPerWindow<V, R> {
    fn new(value_of: fn(&V) -> u64, emit: fn(i64, u64, &V, &mut Collector<'_, R>)) -> Self {
        MaxPerWindow { rows: ListState::new("window-rows"), value_of, emit }
    }
}

impl<V: weir_api::Data + Sync, R: Send + 'static> KeyedProcessFunction<i64, (i64, u64, V), R> for MaxPerWindow<V, R> {
    fn states(&self) -> Vec<StateDeclaration> {
        vec![self.rows.declaration()]
    }

    fn process_element(
        &mut self,
        row: (i64, u64, V),
        ctx: &mut KeyedContext<'_, i64>,
        _out: &mut Collector<'_, R>,
    ) -> FnResult {
        ctx.list(&self.rows)?.add((row.1, row.2));
        // Every per-key result of this window came before the watermark passes its end.
        ctx.register_event_time_timer(row.0 - 1);
        Ok(())
    }

    fn on_timer(&mut self, _timestamp: i64, ctx: &mut KeyedContext<'_, i64>, out: &mut Collector<'_, R>) -> FnResult {
        let window_end = *ctx.current_key();
        let rows = ctx.list(&self.rows)?.get().to_vec();
        ctx.list(&self.rows)?.clear();
        let Some(max) = rows.iter().map(|(_, v)| (self.value_of)(v)).max() else { return Ok(()) };
        for (key, value) in rows.iter().filter(|(_, v)| (self.value_of)(v) == max) {
            (self.emit)(window_end, *key, value, out);
        }
        Ok(())
    }
}

/// q5, hot items: per sliding window (10 s every 2 s) the auctions with the most bids
/// (`window_end auction bids`).
pub fn q5(events: &DataStream<Event>) -> DataStream<(i64, u64, u64)> {
    bids(events)
        .key_by(|b: &Bid| b.auction)
        .window(SlidingEventTimeWindows::of(Q5_SIZE, Q5_SLIDE))
        .aggregate_with_process(Count, WithWindowEnd)
        .uid("q5-bids-per-auction")
        .key_by(|row: &(i64, u64, u64)| row.0)
        .process(MaxPerWindow::<u64, (i64, u64, u64)>::new(
            |count| *count,
            |window_end, auction, count, out| out.collect((window_end, auction, *count)),
        ))
        .uid("q5")
}

/// The highest bids of one auction in a window: their price and `(bidder, time)`.
pub type TopBids = (u64, Vec<(u64, i64)>);

/// Keeps the highest-priced bids.
#[derive(Clone)]
pub struct HighestBids;

impl AggregateFunction<Bid, TopBids, TopBids> for HighestBids {
    fn create_accumulator(&self) -> TopBids {
        (0, Vec::new())
    }
    fn add(&self, bid: Bid, mut acc: TopBids) -> TopBids {
        if bid.price > acc.0 || acc.1.is_empty() {
            acc = (bid.price, Vec::new());
        }
        if bid.price == acc.0 {
            acc.1.push((bid.bidder, bid.date_time));
        }
        acc
    }
    fn get_result(&self, acc: &TopBids) -> TopBids {
        acc.clone()
    }
    fn merge(&self, a: TopBids, b: TopBids) -> TopBids {
        match a.0.cmp(&b.0) {
            std::cmp::Ordering::Greater => a,
            std::cmp::Ordering::Less => b,
            std::cmp::Ordering::Equal => (a.0, [a.1, b.1].concat()),
        }
    }
}

/// q7, highest bid: per tumbling 10 s window the bids at the window's highest price
/// (`window_end auction price bidder date_time`, one line per such bid).
pub fn q7(events: &DataStream<Event>) -> DataStream<(i64, u64, u64, u64, i64)> {
    bids(events)
        .key_by(|b: &Bid| b.auction)
        .window(TumblingEventTimeWindows::of(Q7_Q8_SIZE))
        .aggregate_with_process(HighestBids, WithWindowEnd)
        .uid("q7-highest-per-auction")
        .key_by(|row: &(i64, u64, TopBids)| row.0)
        .process(MaxPerWindow::<TopBids, (i64, u64, u64, u64, i64)>::new(
            |top| top.0,
            |window_end, auction, top, out| {
                let mut bids = top.1.clone();
                bids.sort_unstable();
                for (bidder, at) in bids {
                    out.collect((window_end, auction, top.0, bidder, at));
                }
            },
        ))
        .uid("q7")
}

/// q8, new users: people who registered and opened an auction in the same tumbling 10 s
/// window (`person name window_start`), a window join of people and auctions on
/// id = seller.
pub fn q8(events: &DataStream<Event>) -> DataStream<String> {
    let people = persons(events);
    let sold = auctions(events);
    people
        .join(&sold)
        .where_key(|p: &Person| p.id)
        .equal_to(|a: &Auction| a.seller)
        .window(TumblingEventTimeWindows::of(Q7_Q8_SIZE))
        .co_group(|window: &TimeWindow, people: &[Person], sold: &[Auction], out: &mut Collector<'_, String>| {
            if !sold.is_empty() {
                for person in people {
                    out.collect(format!("{}\t{}\t{}", person.id, person.name, window.start));
                }
            }
        })
        .uid("q8")
}

/// q11's session gap.
const Q11_GAP: Duration = Duration::from_secs(10);

/// Tags a session's bid count with the bidder and the session's bounds.
#[derive(Clone)]
pub struct SessionRow;

impl ProcessWindowFunction<u64, u64, String> for SessionRow {
    fn process(
        &mut self,
        bidder: &u64,
        context: &WindowContext<'_>,
        counts: &[u64],
        out: &mut Collector<'_, String>,
    ) -> FnResult {
        for count in counts {
            out.collect(format!("{bidder}\t{count}\t{}\t{}", context.window.start, context.window.end));
        }
        Ok(())
    }
}

/// q11, user sessions: the bids of each bidder per session (bids less than 10 s apart), with
/// the session's bounds (`bidder bids session_start session_end`).
pub fn q11(events: &DataStream<Event>) -> DataStream<String> {
    bids(events)
        .key_by(|b: &Bid| b.bidder)
        .window(EventTimeSessionWindows::with_gap(Q11_GAP))
        .aggregate_with_process(Count, SessionRow)
        .uid("q11")
}

/// The queries this job runs, by name.
pub const QUERIES: [&str; 9] = ["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11"];

/// Writes the fields of a row tab-separated (the sink formats, so a discarding sink costs
/// nothing per row).
pub trait Row {
    /// Appends the row's fields.
    fn write_to(&self, line: &mut String);
    /// The first field: the Kafka key.
    fn write_key(&self, line: &mut String);
}

impl Row for Bid {
    fn write_to(&self, line: &mut String) {
        let _ = write!(line, "{}\t{}\t{}\t{}", self.auction, self.bidder, self.price, self.date_time);
    }
    fn write_key(&self, line: &mut String) {
        let _ = write!(line, "{}", self.auction);
    }
}

impl Row for String {
    fn write_to(&self, line: &mut String) {
        line.push_str(self);
    }
    fn write_key(&self, line: &mut String) {
        line.push_str(self.split('\t').next().unwrap_or_default());
    }
}

impl Row for (u64, u64) {
    fn write_to(&self, line: &mut String) {
        let _ = write!(line, "{}\t{}", self.0, self.1);
    }
    fn write_key(&self, line: &mut String) {
        let _ = write!(line, "{}", self.0);
    }
}

impl Row for (i64, u64, u64) {
    fn write_to(&self, line: &mut String) {
        let _ = write!(line, "{}\t{}\t{}", self.0, self.1, self.2);
    }
    fn write_key(&self, line: &mut String) {
        let _ = write!(line, "{}", self.0);
    }
}

impl Row for (i64, u64, u64, u64, i64) {
    fn write_to(&self, line: &mut String) {
        let _ = write!(line, "{}\t{}\t{}\t{}\t{}", self.0, self.1, self.2, self.3, self.4);
    }
    fn write_key(&self, line: &mut String) {
        let _ = write!(line, "{}", self.0);
    }
}

fn attach<T: weir_api::Data + Row>(
    output: &Output,
    args: &JobArgs,
    stream: &DataStream<T>,
) -> Result<(), JobBuildError> {
    output.attach(args, stream, T::write_to, T::write_key).map(|_| ())
}

/// Builds query `name` over `events`, into `output`; `None` for a query this job lacks.
pub fn build(
    name: &str,
    events: &DataStream<Event>,
    output: &Output,
    args: &JobArgs,
) -> Option<Result<(), JobBuildError>> {
    Some(match name {
        "q0" => attach(output, args, &q0(events)),
        "q1" => attach(output, args, &q1(events)),
        "q2" => attach(output, args, &q2(events)),
        "q3" => attach(output, args, &q3(events)),
        "q4" => attach(output, args, &q4(events)),
        "q5" => attach(output, args, &q5(events)),
        "q7" => attach(output, args, &q7(events)),
        "q8" => attach(output, args, &q8(events)),
        "q11" => attach(output, args, &q11(events)),
        _ => return None,
    })
}
