//! Nexmark's three record types, and the generator that makes event `n` of the stream: the
//! same event for the same `n` on every run and every parallelism (a seeded pseudo-random
//! choice per event), with Nexmark's proportions (1 person : 3 auctions : 46 bids per 50
//! events) and event times 0.1 ms apart (Nexmark's default 10 000 events per second).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A person registering on the auction site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Person id (from 1000).
    pub id: u64,
    /// Full name.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// Credit card number.
    pub credit_card: String,
    /// City.
    pub city: Cow<'static, str>,
    /// US state.
    pub state: Cow<'static, str>,
    /// Event time, epoch ms.
    pub date_time: i64,
}

/// An item put up for auction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// Auction id (from 1000).
    pub id: u64,
    /// Item name.
    pub item_name: String,
    /// Opening price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents.
    pub reserve: u64,
    /// Event time, epoch ms.
    pub date_time: i64,
    /// When the auction closes, epoch ms.
    pub expires: i64,
    /// The selling person's id.
    pub seller: u64,
    /// Category (10 to 14).
    pub category: u64,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    /// The auction's id.
    pub auction: u64,
    /// The bidding person's id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// Where the bid came from.
    pub channel: Cow<'static, str>,
    /// The page it was placed on.
    pub url: Cow<'static, str>,
    /// Event time, epoch ms.
    pub date_time: i64,
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Event {
    /// The event's time, epoch ms.
    pub fn date_time(&self) -> i64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}

const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const TOTAL_PROPORTION: u64 = 50;
/// The first person's and the first auction's id.
pub const FIRST_ID: u64 = 1000;
/// The first of the 5 categories.
pub const FIRST_CATEGORY: u64 = 10;
const CATEGORIES: u64 = 5;
/// Event 0's time: 2025-01-01T00:00:00Z (a multiple of every window size the queries use).
pub const BASE_TIME_MS: i64 = 1_735_689_600_000;
/// Event times advance by 100 µs per event.
const EVENTS_PER_MS: u64 = 10;
/// Bids go to one of the newest auctions, sellers and bidders are among the newest people.
const ACTIVE_AUCTIONS: u64 = 100;
const ACTIVE_PEOPLE: u64 = 1000;
const HOT_AUCTION_PERCENT: u64 = 50;
const HOT_BIDDER_PERCENT: u64 = 25;
const HOT_SELLER_PERCENT: u64 = 25;

const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
const LAST_NAMES: [&str; 9] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];
const CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
const STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const URLS: [&str; 4] = [
    "https://www.nexmark.com/item.htm?query=1",
    "https://www.nexmark.com/item.htm?query=2&channel_id=1",
    "https://www.nexmark.com/search.htm?query=3",
    "https://www.nexmark.com/bid.htm?query=4&channel_id=2",
];

/// A small, fast, seedable generator (splitmix64): one per event, seeded with its number.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 { 0 } else { self.next() % bound }
    }
}

/// Price exponents a bid draws from (10^(i / 1000) dollars for i below this).
const PRICE_STEPS: usize = 6_000;

/// `round(10^(i / 1000) * 100)` cents for every step, computed once (a `powf` per bid was a
/// twentieth of q0's time).
fn price_table() -> &'static [u64; PRICE_STEPS] {
    static TABLE: std::sync::OnceLock<[u64; PRICE_STEPS]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [0u64; PRICE_STEPS];
        for (step, price) in table.iter_mut().enumerate() {
            *price = (10f64.powf(step as f64 / 1_000.0) * 100.0).round() as u64;
        }
        table
    })
}

/// The time of event `n`.
pub fn event_time(n: u64) -> i64 {
    BASE_TIME_MS + (n / EVENTS_PER_MS) as i64
}

/// The 0-based id of the newest person created by events `0..=n` (one person opens each
/// epoch of 50 events).
fn last_person(n: u64) -> u64 {
    n / TOTAL_PROPORTION * PERSON_PROPORTION
}

/// The 0-based id of the newest auction created by events `0..=n` (saturating at 0).
fn last_auction(n: u64) -> u64 {
    let epoch = n / TOTAL_PROPORTION;
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        // The newest auction is the previous epoch's last.
        return (epoch * AUCTION_PROPORTION).saturating_sub(1);
    }
    let offset = (offset - PERSON_PROPORTION).min(AUCTION_PROPORTION - 1);
    epoch * AUCTION_PROPORTION + offset
}

/// One of the newest people (some "hot" ones more often).
fn recent_person(random: &mut Random, n: u64, hot_percent: u64) -> u64 {
    let newest = last_person(n);
    if random.below(100) < hot_percent {
        return FIRST_ID + (newest / 4) * 4;
    }
    let oldest = newest.saturating_sub(ACTIVE_PEOPLE);
    FIRST_ID + oldest + random.below(newest - oldest + 1)
}

/// Event number `n` of the Nexmark stream.
pub fn generate(n: u64) -> Event {
    let mut random = Random(n ^ 0x5EED_1E55_0000_0000);
    let date_time = event_time(n);
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        let id = FIRST_ID + last_person(n);
        let first = FIRST_NAMES[random.below(FIRST_NAMES.len() as u64) as usize];
        let last = LAST_NAMES[random.below(LAST_NAMES.len() as u64) as usize];
        let city = CITIES[random.below(CITIES.len() as u64) as usize];
        let state = STATES[random.below(STATES.len() as u64) as usize];
        return Event::Person(Person {
            id,
            name: format!("{first} {last}"),
            email_address: format!("{}@{}.com", first.to_lowercase(), last.to_lowercase()),
            credit_card: format!(
                "{:04} {:04} {:04} {:04}",
                random.below(10_000),
                random.below(10_000),
                random.below(10_000),
                random.below(10_000)
            ),
            city: Cow::Borrowed(city),
            state: Cow::Borrowed(state),
            date_time,
        });
    }
    if offset < PERSON_PROPORTION + AUCTION_PROPORTION {
        let id = FIRST_ID + last_auction(n);
        let initial_bid = 100 + random.below(10_000);
        return Event::Auction(Auction {
            id,
            item_name: format!("item-{}", random.below(100_000)),
            initial_bid,
            reserve: initial_bid + random.below(10_000),
            date_time,
            // Open for 1 to 21 seconds.
            expires: date_time + 1_000 + random.below(20_000) as i64,
            seller: recent_person(&mut random, n, HOT_SELLER_PERCENT),
            category: FIRST_CATEGORY + random.below(CATEGORIES),
        });
    }
    let newest = last_auction(n);
    let auction = if random.below(100) < HOT_AUCTION_PERCENT {
        FIRST_ID + (newest / 2) * 2
    } else {
        let oldest = newest.saturating_sub(ACTIVE_AUCTIONS);
        FIRST_ID + oldest + random.below(newest - oldest + 1)
    };
    // Nexmark's price distribution: 10^(0..6) dollars, in cents, skewed low.
    let price = price_table()[random.below(PRICE_STEPS as u64) as usize];
    Event::Bid(Bid {
        auction,
        bidder: recent_person(&mut random, n, HOT_BIDDER_PERCENT),
        price,
        channel: Cow::Borrowed(CHANNELS[random.below(CHANNELS.len() as u64) as usize]),
        url: Cow::Borrowed(URLS[random.below(URLS.len() as u64) as usize]),
        date_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportions_ids_and_times_follow_nexmark() {
        let events: Vec<Event> = (0..5_000).map(generate).collect();
        let people = events.iter().filter(|e| matches!(e, Event::Person(_))).count();
        let auctions = events.iter().filter(|e| matches!(e, Event::Auction(_))).count();
        assert_eq!((people, auctions, events.len() - people - auctions), (100, 300, 4600));
        let person_ids: Vec<u64> =
            events.iter().filter_map(|e| if let Event::Person(p) = e { Some(p.id) } else { None }).collect();
        assert_eq!(person_ids, (FIRST_ID..FIRST_ID + 100).collect::<Vec<_>>());
        let auction_ids: Vec<u64> =
            events.iter().filter_map(|e| if let Event::Auction(a) = e { Some(a.id) } else { None }).collect();
        assert_eq!(auction_ids, (FIRST_ID..FIRST_ID + 300).collect::<Vec<_>>());
        // Every reference points at something that exists by then.
        for (n, event) in events.iter().enumerate() {
            match event {
                Event::Bid(b) => {
                    assert!(
                        b.auction < FIRST_ID + 1 + last_auction(n as u64) && b.auction >= FIRST_ID,
                        "event {n}: {b:?}"
                    );
                    assert!(b.bidder <= FIRST_ID + last_person(n as u64));
                }
                Event::Auction(a) => assert!(a.seller <= FIRST_ID + last_person(n as u64)),
                Event::Person(_) => {}
            }
            assert_eq!(event.date_time(), BASE_TIME_MS + n as i64 / 10);
        }
        assert_eq!(generate(4242), generate(4242), "the same event every time");
    }
}
