//! A service's (or waypoint's) scope from its annotations and labels.

use ferry_topology::schema::ScopeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Tx, label, setting};

/// Ferry's explicit scope: `local`, `global` or `cluster-a,cluster-b`.
pub(super) const SCOPE_KEY: &str = "ferry.dev/scope";
/// Istio's ambient multi-cluster convention: `"true"` makes a service global.
const ISTIO_GLOBAL: &str = "istio.io/global";

impl Tx<'_> {
    /// The scope `meta` declares in `cluster`, else the mesh default. A value that does not
    /// parse is a note and makes the scope local: never wider than what was asked. Clusters
    /// the mesh does not have are left out of a list, with a note (none left: local).
    /// Whether `meta` declares a scope of its own (Ferry's or Istio's), not the mesh default.
    pub(super) fn declares_scope(meta: &ObjectMeta) -> bool {
        setting(meta, SCOPE_KEY).is_some() || label(meta, ISTIO_GLOBAL).is_some()
    }

    pub(super) fn scope_of(&mut self, cluster: &str, object: &str, meta: &ObjectMeta) -> ScopeSpec {
        if let Some(v) = setting(meta, SCOPE_KEY) {
            return match parse(v) {
                Ok(ScopeSpec::Clusters(list)) => {
                    let (known, unknown): (Vec<String>, Vec<String>) = list
                        .into_iter()
                        .partition(|c| self.file.clusters.iter().any(|k| &k.name == c));
                    if !unknown.is_empty() {
                        let msg = format!(
                            "{SCOPE_KEY}: no cluster {unknown:?} in the mesh; left out of the scope"
                        );
                        self.note(cluster, object.to_string(), msg);
                    }
                    if known.is_empty() {
                        ScopeSpec::Local
                    } else {
                        ScopeSpec::Clusters(known)
                    }
                }
                Ok(s) => s,
                Err(why) => {
                    let msg = format!("{SCOPE_KEY}: {why}; taken as local");
                    self.note(cluster, object.to_string(), msg);
                    ScopeSpec::Local
                }
            };
        }
        if label(meta, ISTIO_GLOBAL) == Some("true") {
            return ScopeSpec::Global;
        }
        self.mesh.default_scope.spec()
    }
}

/// Parses `local`, `global` or a comma list of cluster IDs.
fn parse(v: &str) -> Result<ScopeSpec, String> {
    match v.trim() {
        v if v.eq_ignore_ascii_case("local") => Ok(ScopeSpec::Local),
        v if v.eq_ignore_ascii_case("global") => Ok(ScopeSpec::Global),
        "" => Err("expected `local`, `global` or a comma list of clusters, found \"\"".into()),
        list => {
            let clusters: Vec<String> = list.split(',').map(|c| c.trim().to_string()).collect();
            if clusters.iter().any(String::is_empty) {
                return Err(format!(
                    "expected a comma list of cluster IDs, found an empty entry in {list:?}"
                ));
            }
            Ok(ScopeSpec::Clusters(clusters))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_values_parse_or_say_what_is_wrong() {
        assert_eq!(parse("local"), Ok(ScopeSpec::Local));
        assert_eq!(parse(" global "), Ok(ScopeSpec::Global));
        assert_eq!(
            parse("east, west"),
            Ok(ScopeSpec::Clusters(vec!["east".into(), "west".into()]))
        );
        assert!(parse("east,,west").unwrap_err().contains("empty entry"));
        assert!(parse("").is_err());
    }
}
