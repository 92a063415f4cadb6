//! The small string-keyed maps of a cached pod (requests, overhead, nodeSelector) as a boxed slice
//! sorted by key, sized to its entries: a `BTreeMap` allocates room for eleven (544 bytes).

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Keys and values sorted by key, one entry per key (a later duplicate wins, as in a JSON object
/// decoded into a map). Reads and writes as a map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactMap<V>(Box<[(String, V)]>);

/// A resource list (`{cpu: 500m, memory: 1Gi}`).
pub type ResourceList = CompactMap<Quantity>;

impl<V> Default for CompactMap<V> {
    fn default() -> Self {
        CompactMap(Box::default())
    }
}

impl<V> CompactMap<V> {
    /// The value of `name`, if listed.
    pub fn get(&self, name: &str) -> Option<&V> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Entries in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Sets `name` to `q` (replacing what it had).
    pub fn insert(&mut self, name: String, q: V) {
        let mut v = std::mem::take(&mut self.0).into_vec();
        v.push((name, q));
        *self = Self::from_entries(v);
    }

    /// Sorted by name, a later entry of a name replacing an earlier one.
    fn from_entries(mut v: Vec<(String, V)>) -> Self {
        // Stable: entries of one name stay in input order, so the last is kept below.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(String, V)> = Vec::with_capacity(v.len());
        for (k, q) in v {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = q,
                _ => out.push((k, q)),
            }
        }
        CompactMap(out.into_boxed_slice())
    }
}

impl<V> FromIterator<(String, V)> for CompactMap<V> {
    fn from_iter<I: IntoIterator<Item = (String, V)>>(iter: I) -> Self {
        Self::from_entries(iter.into_iter().collect())
    }
}

impl<V> From<BTreeMap<String, V>> for CompactMap<V> {
    fn from(m: BTreeMap<String, V>) -> Self {
        // Already sorted and unique.
        CompactMap(m.into_iter().collect::<Vec<_>>().into_boxed_slice())
    }
}

impl<V: Clone> From<&CompactMap<V>> for BTreeMap<String, V> {
    fn from(m: &CompactMap<V>) -> Self {
        m.0.iter().cloned().collect()
    }
}

impl<'a, V> IntoIterator for &'a CompactMap<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (String, V)>,
        fn(&'a (String, V)) -> (&'a String, &'a V),
    >;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<V: Serialize> Serialize for CompactMap<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0.iter() {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for CompactMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = CompactMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map with string keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<CompactMap<V>, A::Error> {
                let mut v = Vec::with_capacity(m.size_hint().unwrap_or(0).min(16));
                while let Some(entry) = m.next_entry::<String, V>()? {
                    v.push(entry);
                }
                Ok(CompactMap::from_entries(v))
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn reads_and_writes_as_the_apis_map() {
        let list: ResourceList =
            serde_json::from_str(r#"{"memory": "1Gi", "cpu": "500m", "cpu": "250m"}"#)
                .expect("a resource map decodes");
        // Sorted, one entry per name, the later duplicate kept (as a map decoder keeps it).
        assert_eq!(list.get("cpu"), Some(&q("250m")));
        assert_eq!(list.get("memory"), Some(&q("1Gi")));
        assert_eq!(list.get("pods"), None);
        assert_eq!(list.len(), 2);
        let names: Vec<&str> = list.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["cpu", "memory"]);
        assert_eq!(
            serde_json::to_value(&list).expect("serializes"),
            serde_json::json!({"cpu": "250m", "memory": "1Gi"})
        );
        assert!(serde_json::from_str::<ResourceList>(r#"["cpu"]"#).is_err());
    }

    #[test]
    fn holds_no_more_room_than_its_entries() {
        let list: ResourceList = serde_json::from_str(r#"{"cpu": "1", "memory": "2Gi"}"#)
            .expect("a resource map decodes");
        assert_eq!(list.0.len(), 2, "a boxed slice has no spare capacity");
    }

    proptest! {
        /// Whatever the entries, the list answers as a `BTreeMap` built from them answers.
        #[test]
        fn answers_as_a_map_does(
            entries in proptest::collection::vec(("[a-e]{1,2}", "[0-9]{1,3}m?"), 0..12),
            probe in "[a-e]{1,2}",
        ) {
            let map: BTreeMap<String, Quantity> =
                entries.iter().map(|(k, v)| (k.clone(), q(v))).collect();
            let list: ResourceList = entries.iter().map(|(k, v)| (k.clone(), q(v))).collect();
            prop_assert_eq!(list.get(&probe), map.get(&probe));
            prop_assert!(list.iter().eq(map.iter()));
            prop_assert_eq!(ResourceList::from(map.clone()), list.clone());
            prop_assert_eq!(BTreeMap::from(&list), map);
            let mut inserted = ResourceList::default();
            for (k, v) in &entries {
                inserted.insert(k.clone(), q(v));
            }
            prop_assert_eq!(inserted, list);
        }
    }
}
