//! One turn at a time: the simulation's driver and its actors (each a real controller on a
//! thread of its own) pass a baton, so exactly one of them runs at any moment and the order
//! is the driver's, drawn from the seed. An actor gives the baton back at each call into the
//! simulated world; the driver hands it to an actor and waits until it comes back.

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    Driver,
    Actor(usize),
}

pub struct Baton {
    turn: Mutex<Turn>,
    changed: Condvar,
}

impl Baton {
    pub fn new() -> Baton {
        Baton { turn: Mutex::new(Turn::Driver), changed: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Turn> {
        self.turn.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait_for(&self, mut turn: MutexGuard<'_, Turn>, wanted: Turn) {
        while *turn != wanted {
            turn = self.changed.wait(turn).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// An actor's thread waits for its first turn.
    pub fn await_turn(&self, actor: usize) {
        let turn = self.lock();
        self.wait_for(turn, Turn::Actor(actor));
    }

    /// Actor `actor` gives the baton back and waits for its next turn.
    pub fn yield_to_driver(&self, actor: usize) {
        let mut turn = self.lock();
        *turn = Turn::Driver;
        self.changed.notify_all();
        self.wait_for(turn, Turn::Actor(actor));
    }

    /// The driver lets `actor` run until it yields or ends.
    pub fn run(&self, actor: usize) {
        let mut turn = self.lock();
        *turn = Turn::Actor(actor);
        self.changed.notify_all();
        self.wait_for(turn, Turn::Driver);
    }

    /// An actor's thread ends: the baton goes back to the driver.
    pub fn end(&self) {
        let mut turn = self.lock();
        *turn = Turn::Driver;
        self.changed.notify_all();
    }
}
