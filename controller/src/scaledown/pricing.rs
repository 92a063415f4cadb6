//! What a node costs per hour (its `ebb.dev/hourly-cost` annotation, else the policy's price
//! table by a node label) and how much a removal saves per evicted pod, for the removal order.

use std::collections::BTreeMap;

use ebb_api::names;
use ebb_api::scaledown::Prices;

use crate::cluster::NodeInfo;

/// The policy's `prices`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct PriceTable {
    pub label: String,
    pub per_hour: BTreeMap<String, f64>,
}

impl PriceTable {
    /// Refuses a price that is not a finite number of at least 0 (the schema refuses them too;
    /// this guards policies read from files): the field and why.
    pub fn from_spec(p: &Prices) -> Result<Self, (&'static str, String)> {
        if p.label.is_empty() {
            return Err(("prices.label", "must name a node label".into()));
        }
        if let Some((value, price)) = p.per_hour.iter().find(|(_, v)| !valid(**v)) {
            return Err((
                "prices.perHour",
                format!("`{value}`: {price} is not a number of at least 0"),
            ));
        }
        Ok(PriceTable {
            label: p.label.clone(),
            per_hour: p.per_hour.clone(),
        })
    }
}

fn valid(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// A decimal number of at least 0 (`"3.06"`), or `None`.
pub fn parse_cost(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| valid(*v))
}

/// Whether the node carries an `ebb.dev/hourly-cost` annotation that is not a number of at
/// least 0 (it is ignored, and reported).
pub fn invalid_cost_annotation(node: &NodeInfo) -> bool {
    node.annotations
        .get(names::ANNOTATION_HOURLY_COST)
        .is_some_and(|v| parse_cost(v).is_none())
}

/// The node's hourly cost: its `ebb.dev/hourly-cost` annotation when it holds a number of at
/// least 0, else the price of its label value in `table`; `None` when neither is known.
pub fn hourly_cost(node: &NodeInfo, table: Option<&PriceTable>) -> Option<f64> {
    if let Some(v) = node.annotations.get(names::ANNOTATION_HOURLY_COST) {
        match parse_cost(v) {
            Some(c) => return Some(c),
            None => tracing::debug!(
                node = %node.name,
                value = %v,
                "ebb.dev/hourly-cost is not a number of at least 0; ignored"
            ),
        }
    }
    let t = table?;
    node.labels
        .get(&t.label)
        .and_then(|v| t.per_hour.get(v))
        .copied()
}

/// What removing a node saves per hour for each pod it evicts (an empty node counts as one):
/// the key removals are ordered by, largest first. Unpriced nodes save nothing known: `None`,
/// after every priced one.
pub fn saving_per_pod(cost: Option<f64>, pods: usize) -> Option<f64> {
    cost.map(|c| c / pods.max(1) as f64)
}

/// Largest saving first, unpriced last; equal savings keep their order (callers sort stably or
/// break ties themselves).
pub fn by_saving(a: Option<f64>, b: Option<f64>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    }
}

/// Hourly cost of the candidate set and of the governed nodes that stay, where known.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostSummary {
    pub removed_per_hour: f64,
    pub kept_per_hour: f64,
    /// Governed nodes without a known price.
    pub unpriced: usize,
    /// Governed nodes whose `ebb.dev/hourly-cost` annotation is not a number of at least 0, by
    /// name.
    pub invalid_annotations: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::node;
    use proptest::prelude::*;

    fn table() -> PriceTable {
        PriceTable {
            label: "node.kubernetes.io/instance-type".into(),
            per_hour: BTreeMap::from([("p4d.24xlarge".into(), 32.77), ("m5.large".into(), 0.096)]),
        }
    }

    #[test]
    fn annotation_first_then_table_by_label() {
        let t = table();
        let typed = |ty: &str| node("n").label("node.kubernetes.io/instance-type", ty);
        assert_eq!(
            hourly_cost(&typed("p4d.24xlarge").info(), Some(&t)),
            Some(32.77)
        );
        assert_eq!(hourly_cost(&typed("m5.large").info(), None), None);
        assert_eq!(hourly_cost(&typed("c5.xlarge").info(), Some(&t)), None);
        let annotated = typed("p4d.24xlarge").annotation(names::ANNOTATION_HOURLY_COST, "20.5");
        assert_eq!(hourly_cost(&annotated.clone().info(), Some(&t)), Some(20.5));
        assert_eq!(
            hourly_cost(
                &node("n")
                    .annotation(names::ANNOTATION_HOURLY_COST, " 1.25 ")
                    .info(),
                None
            ),
            Some(1.25)
        );
        assert!(!invalid_cost_annotation(&annotated.info()));
        assert!(!invalid_cost_annotation(&typed("m5.large").info()));
        for bad in ["-1", "NaN", "inf", "three dollars", ""] {
            let n = typed("m5.large").annotation(names::ANNOTATION_HOURLY_COST, bad);
            assert!(invalid_cost_annotation(&n.clone().info()), "`{bad}`");
            assert_eq!(
                hourly_cost(&n.info(), Some(&t)),
                Some(0.096),
                "`{bad}` is ignored: the table's price applies"
            );
        }
    }

    #[test]
    fn tables_with_bad_prices_are_refused() {
        for bad in [-0.5, f64::NAN, f64::INFINITY] {
            let p = Prices {
                label: "l".into(),
                per_hour: BTreeMap::from([("x".into(), bad)]),
            };
            let e = PriceTable::from_spec(&p).err();
            assert!(
                e.as_ref()
                    .is_some_and(|(field, why)| *field == "prices.perHour" && why.contains("`x`")),
                "{bad}: {e:?}"
            );
        }
        let empty_label = Prices {
            label: String::new(),
            per_hour: BTreeMap::new(),
        };
        assert!(PriceTable::from_spec(&empty_label).is_err());
    }

    #[test]
    fn savings_per_evicted_pod() {
        assert_eq!(saving_per_pod(Some(32.0), 0), Some(32.0));
        assert_eq!(saving_per_pod(Some(32.0), 4), Some(8.0));
        assert_eq!(saving_per_pod(None, 0), None);
    }

    proptest! {
        /// Sorting by saving puts larger savings first and unpriced nodes last, whatever the
        /// input order.
        #[test]
        fn by_saving_is_a_total_order_largest_first(
            v in proptest::collection::vec(proptest::option::of(0.0f64..1000.0), 0..30)
        ) {
            let mut sorted = v.clone();
            sorted.sort_by(|a, b| by_saving(*a, *b));
            for w in sorted.windows(2) {
                match (w[0], w[1]) {
                    (Some(a), Some(b)) => prop_assert!(a >= b),
                    (None, Some(_)) => prop_assert!(false, "unpriced before priced"),
                    _ => {}
                }
            }
            prop_assert_eq!(sorted.len(), v.len());
        }
    }
}
