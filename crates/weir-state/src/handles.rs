//! Typed state handles and the accessors a keyed function uses for the current key.
//!
//! A handle names a state and remembers, after its first use, which table of the subtask's
//! backend holds it, so later accesses are an index and a hash lookup.

use std::cell::OnceCell;
use std::hash::Hash;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use weir_types::Key;

use crate::FastMap;
use crate::keymap::{KeyMap, KeyRef};
use crate::table::{ListCell, MapCell, ValueCell};

/// The kinds of keyed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// One value per key.
    Value,
    /// A list per key.
    List,
    /// A map per key.
    Map,
    /// One value per key, folded with a reduce function.
    Reducing,
    /// Processing-time timers of a keyed operator (written with its keyed state).
    Timers,
}

impl std::str::FromStr for StateKind {
    type Err = String;

    fn from_str(text: &str) -> Result<StateKind, String> {
        match text {
            "value" => Ok(StateKind::Value),
            "list" => Ok(StateKind::List),
            "map" => Ok(StateKind::Map),
            "reducing" => Ok(StateKind::Reducing),
            "timers" => Ok(StateKind::Timers),
            other => Err(format!("unknown state kind '{other}'")),
        }
    }
}

impl std::fmt::Display for StateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
            StateKind::Reducing => "reducing",
            StateKind::Timers => "timers",
        };
        f.write_str(name)
    }
}

/// Bound for everything stored in state.
///
/// `Clone` because a checkpoint copies state synchronously and serializes the copy while
/// processing goes on.
pub trait StateData: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> StateData for T {}

/// One keyed state as a function declares it before it runs (Flink's state descriptor):
/// its name, kind and the Rust type of its stored cells, exactly as snapshots record them,
/// so a restore can be checked before the job starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateDeclaration {
    /// The state's name, unique within its operator.
    pub name: &'static str,
    /// Value, list, map or reducing.
    pub kind: StateKind,
    /// The Rust type of its cells (what `_metadata` records as the state's `value_type`).
    pub cell_type: &'static str,
}

impl StateDeclaration {
    /// `value state of weir_state::table::ValueCell<u64>`: how errors name it.
    pub fn describe(&self) -> String {
        format!("{} state of {}", self.kind, self.cell_type)
    }
}

/// Declares a value state: one `V` per key (Flink's `ValueState`).
pub struct ValueState<V> {
    pub(crate) name: &'static str,
    pub(crate) slot: OnceCell<usize>,
    _value: PhantomData<fn() -> V>,
}

impl<V: StateData> ValueState<V> {
    /// A value state named `name`, unique within its operator.
    pub fn new(name: &'static str) -> ValueState<V> {
        ValueState { name, slot: OnceCell::new(), _value: PhantomData }
    }

    /// What this handle declares (return it from the function's `states`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration {
            name: self.name,
            kind: StateKind::Value,
            cell_type: std::any::type_name::<crate::table::ValueCell<V>>(),
        }
    }
}

/// Declares a list state: a `Vec<V>` per key (Flink's `ListState`).
pub struct ListState<V> {
    pub(crate) name: &'static str,
    pub(crate) slot: OnceCell<usize>,
    _value: PhantomData<fn() -> V>,
}

impl<V: StateData> ListState<V> {
    /// A list state named `name`, unique within its operator.
    pub fn new(name: &'static str) -> ListState<V> {
        ListState { name, slot: OnceCell::new(), _value: PhantomData }
    }

    /// What this handle declares (return it from the function's `states`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration {
            name: self.name,
            kind: StateKind::List,
            cell_type: std::any::type_name::<crate::table::ListCell<V>>(),
        }
    }
}

/// Declares a map state: a map from `UK` to `UV` per key (Flink's `MapState`).
pub struct MapState<UK, UV> {
    pub(crate) name: &'static str,
    pub(crate) slot: OnceCell<usize>,
    _value: PhantomData<fn() -> (UK, UV)>,
}

impl<UK: StateData + Eq + Hash, UV: StateData> MapState<UK, UV> {
    /// A map state named `name`, unique within its operator.
    pub fn new(name: &'static str) -> MapState<UK, UV> {
        MapState { name, slot: OnceCell::new(), _value: PhantomData }
    }

    /// What this handle declares (return it from the function's `states`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration {
            name: self.name,
            kind: StateKind::Map,
            cell_type: std::any::type_name::<crate::table::MapCell<UK, UV>>(),
        }
    }
}

/// Declares a reducing state: values added for a key are folded with `reduce`
/// (Flink's `ReducingState`).
pub struct ReducingState<V> {
    pub(crate) name: &'static str,
    pub(crate) slot: OnceCell<usize>,
    pub(crate) reduce: fn(V, V) -> V,
}

impl<V: StateData> ReducingState<V> {
    /// A reducing state named `name` folding with `reduce(accumulated, new)`.
    pub fn new(name: &'static str, reduce: fn(V, V) -> V) -> ReducingState<V> {
        ReducingState { name, slot: OnceCell::new(), reduce }
    }

    /// What this handle declares (return it from the function's `states`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration {
            name: self.name,
            kind: StateKind::Reducing,
            cell_type: std::any::type_name::<crate::table::ValueCell<V>>(),
        }
    }
}

/// Access to a value state for the current key.
pub struct ValueAccess<'a, K, V> {
    pub(crate) map: &'a mut KeyMap<K, ValueCell<V>>,
    pub(crate) key: KeyRef<'a, K>,
}

impl<K: Key, V> ValueAccess<'_, K, V> {
    /// The current key's value, if any.
    #[inline]
    pub fn get(&self) -> Option<&V> {
        self.map.get(self.key.hash, self.key.key).map(|cell| &cell.0)
    }

    /// The current key's value, to change in place, if any (one lookup for a read and a write).
    #[inline]
    pub fn get_mut(&mut self) -> Option<&mut V> {
        self.map.get_mut(self.key.hash, self.key.key).map(|cell| &mut cell.0)
    }

    /// Sets the current key's value.
    #[inline]
    pub fn set(&mut self, value: V) {
        self.map.insert(self.key.hash, self.key.key, ValueCell(value));
    }

    /// The current key's value, inserting `init()` first when there is none.
    #[inline]
    pub fn get_or_insert_with(&mut self, init: impl FnOnce() -> V) -> &mut V {
        &mut self.map.get_or_insert_with(self.key.hash, self.key.key, || ValueCell(init())).0
    }

    /// Removes the current key's value.
    pub fn clear(&mut self) {
        self.map.remove(self.key.hash, self.key.key);
    }
}

/// Access to a list state for the current key.
pub struct ListAccess<'a, K, V> {
    pub(crate) map: &'a mut KeyMap<K, ListCell<V>>,
    pub(crate) key: KeyRef<'a, K>,
}

impl<K: Key, V> ListAccess<'_, K, V> {
    /// The current key's list (empty when none).
    pub fn get(&self) -> &[V] {
        match self.map.get(self.key.hash, self.key.key) {
            Some(cell) => &cell.0,
            None => &[],
        }
    }

    /// Appends to the current key's list.
    pub fn add(&mut self, value: V) {
        self.map.get_or_insert_with(self.key.hash, self.key.key, || ListCell(Vec::new())).0.push(value);
    }

    /// Replaces the current key's list; an empty list clears it.
    pub fn update(&mut self, values: Vec<V>) {
        if values.is_empty() {
            self.map.remove(self.key.hash, self.key.key);
        } else {
            self.map.insert(self.key.hash, self.key.key, ListCell(values));
        }
    }

    /// Removes the current key's list.
    pub fn clear(&mut self) {
        self.map.remove(self.key.hash, self.key.key);
    }
}

/// Access to a map state for the current key.
pub struct MapAccess<'a, K, UK, UV> {
    pub(crate) map: &'a mut KeyMap<K, MapCell<UK, UV>>,
    pub(crate) key: KeyRef<'a, K>,
}

impl<K: Key, UK: Eq + Hash, UV> MapAccess<'_, K, UK, UV> {
    /// The value under `user_key` for the current key.
    pub fn get(&self, user_key: &UK) -> Option<&UV> {
        self.map.get(self.key.hash, self.key.key).and_then(|cell| cell.0.get(user_key))
    }

    /// Puts `user_value` under `user_key` for the current key.
    pub fn put(&mut self, user_key: UK, user_value: UV) {
        let cell = self.map.get_or_insert_with(self.key.hash, self.key.key, || MapCell(FastMap::default()));
        cell.0.insert(user_key, user_value);
    }

    /// Removes `user_key` for the current key, returning its value.
    pub fn remove(&mut self, user_key: &UK) -> Option<UV> {
        let cell = self.map.get_mut(self.key.hash, self.key.key)?;
        let removed = cell.0.remove(user_key);
        if cell.0.is_empty() {
            self.map.remove(self.key.hash, self.key.key);
        }
        removed
    }

    /// True when `user_key` has a value for the current key.
    pub fn contains(&self, user_key: &UK) -> bool {
        self.get(user_key).is_some()
    }

    /// The current key's entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&UK, &UV)> {
        self.map.get(self.key.hash, self.key.key).into_iter().flat_map(|cell| cell.0.iter())
    }

    /// Number of entries for the current key.
    pub fn len(&self) -> usize {
        self.map.get(self.key.hash, self.key.key).map(|cell| cell.0.len()).unwrap_or(0)
    }

    /// True when the current key has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry of the current key.
    pub fn clear(&mut self) {
        self.map.remove(self.key.hash, self.key.key);
    }
}

/// Access to a reducing state for the current key.
pub struct ReducingAccess<'a, K, V> {
    pub(crate) map: &'a mut KeyMap<K, ValueCell<V>>,
    pub(crate) key: KeyRef<'a, K>,
    pub(crate) reduce: fn(V, V) -> V,
}

impl<K: Key, V> ReducingAccess<'_, K, V> {
    /// The folded value, if anything was added.
    pub fn get(&self) -> Option<&V> {
        self.map.get(self.key.hash, self.key.key).map(|cell| &cell.0)
    }

    /// Folds `value` into the current key's accumulated value.
    pub fn add(&mut self, value: V) {
        let folded = match self.map.remove(self.key.hash, self.key.key) {
            Some(cell) => (self.reduce)(cell.0, value),
            None => value,
        };
        self.map.insert(self.key.hash, self.key.key, ValueCell(folded));
    }

    /// Removes the current key's value.
    pub fn clear(&mut self) {
        self.map.remove(self.key.hash, self.key.key);
    }
}

impl<V> Clone for ReducingState<V> {
    fn clone(&self) -> Self {
        ReducingState { name: self.name, slot: self.slot.clone(), reduce: self.reduce }
    }
}

impl<V> Clone for ValueState<V> {
    fn clone(&self) -> Self {
        ValueState { name: self.name, slot: self.slot.clone(), _value: PhantomData }
    }
}

impl<V> Clone for ListState<V> {
    fn clone(&self) -> Self {
        ListState { name: self.name, slot: self.slot.clone(), _value: PhantomData }
    }
}

impl<UK, UV> Clone for MapState<UK, UV> {
    fn clone(&self) -> Self {
        MapState { name: self.name, slot: self.slot.clone(), _value: PhantomData }
    }
}
