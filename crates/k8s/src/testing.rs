//! An in-process stand-in for a Kubernetes API server, because none runs on these machines. It
//! speaks the list/watch protocol over real HTTP (hyper) to the real kube-rs client: lists with
//! a resourceVersion, watch streams of ADDED / MODIFIED / DELETED / BOOKMARK events from a
//! given resourceVersion, `410 Gone` (an ERROR event with an `Expired` status) once history is
//! compacted, dropped watches, refused requests (429, 5xx) and a server that goes away. Its
//! objects start as recorded fixtures (`kubectl get -o yaml` lists).
//!
//! Collections are served cluster-wide (`/api/v1/pods`, `/apis/<group>/<version>/<plural>`:
//! what `Api::all` asks for) and in one namespace (`/api/v1/namespaces/<ns>/secrets`: what
//! `Api::namespaced` asks for), with equality field selectors (`fieldSelector=
//! spec.nodeName=node-1`, as a node agent watches its own node's pods) and equality label
//! selectors (`labelSelector=istio/multiCluster=true`, as remote secrets are watched); any
//! other selector is refused with `400`. Single objects are read (`GET`), created (`POST`,
//! `409 AlreadyExists`), replaced (`PUT`, `409 Conflict` unless the `resourceVersion` sent is
//! the stored one), server-side applied, status-patched and deleted; every write is logged
//! with the bearer token it came with ([`ApiServer::writes`]), so a test can tell which client
//! made it. Every kind the watch reads is served at the path kube-rs
//! asks for (see [`collection_of`]), `discovery.k8s.io/v1` EndpointSlices at
//! `/apis/discovery.k8s.io/v1/endpointslices` included; a kind with no objects lists empty.
//! Built with the `testing` feature, for tests only.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;

type Body = BoxBody<Bytes, Infallible>;

/// One change, as a watch reports it.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    collection: String,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct State {
    rv: u64,
    /// Collection path to `namespace/name` to object.
    collections: BTreeMap<String, BTreeMap<String, Value>>,
    log: Vec<Change>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    compacted: u64,
    /// Collection path to the status codes its next requests are refused with.
    refuse: BTreeMap<String, Vec<u16>>,
    requests: u64,
    /// Lists served, and watches answered with 410 Gone.
    lists: u64,
    gone: u64,
    patches: u64,
    /// Server-side applies served.
    applies: u64,
    /// Every status patch served, in order.
    patch_log: Vec<Patched>,
    /// Every write served, in order.
    writes: Vec<Write>,
}

/// One write the server made (a create, replace, patch or delete), and who made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: String,
    /// The object's kind and `namespace/name`.
    pub kind: String,
    pub key: String,
    /// The bearer token it came with (see [`ApiServer::client_as`]), else `anonymous`.
    pub user: String,
    /// The object as stored after it (as deleted, for a delete).
    pub object: Value,
}

/// One patch the server applied, as the client sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patched {
    /// The request path (`/api/v1/namespaces/<ns>/pods/<name>/status`).
    pub path: String,
    /// Its `content-type` (`application/merge-patch+json` for a JSON merge patch).
    pub content_type: String,
    pub body: Value,
}

/// A `fieldSelector`: every `path=value` (or `path==value`) term must hold; a field the object
/// does not have is the empty string, as the API server takes it.
#[derive(Clone, Debug, Default)]
struct FieldSelector(Vec<(Vec<String>, String)>);

impl FieldSelector {
    /// The `fieldSelector` of a raw query string (percent-encoded), or what is wrong with it.
    fn of_query(query: &str) -> Result<Self, String> {
        let Some((_, text)) =
            form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "fieldSelector")
        else {
            return Ok(Self::default());
        };
        let mut terms = Vec::new();
        for term in text.split(',').filter(|t| !t.is_empty()) {
            if term.contains("!=") {
                return Err(format!(
                    "field selector term {term:?}: only = and == are served here"
                ));
            }
            let (path, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .ok_or_else(|| format!("field selector term {term:?} is not path=value"))?;
            terms.push((
                path.split('.').map(str::to_string).collect(),
                value.to_string(),
            ));
        }
        Ok(Self(terms))
    }

    /// Adds the `labelSelector` of a raw query string: every `key=value` (or `key==value`)
    /// must be a label of the object; other forms are refused.
    fn with_labels(mut self, query: &str) -> Result<Self, String> {
        let Some((_, text)) =
            form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "labelSelector")
        else {
            return Ok(self);
        };
        for term in text.split(',').filter(|t| !t.is_empty()) {
            let (key, value) = term
                .split_once("==")
                .or_else(|| term.split_once('='))
                .filter(|(k, _)| !k.ends_with('!'))
                .ok_or_else(|| {
                    format!("label selector term {term:?}: only key=value is served here")
                })?;
            self.0.push((
                vec!["metadata".into(), "labels".into(), key.to_string()],
                value.to_string(),
            ));
        }
        Ok(self)
    }

    /// Only objects of namespace `ns` (a namespaced collection's path).
    fn in_namespace(mut self, ns: &str) -> Self {
        self.0
            .push((vec!["metadata".into(), "namespace".into()], ns.to_string()));
        self
    }

    fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, want)| {
            let got = path.iter().try_fold(object, |v, k| v.get(k));
            got.and_then(Value::as_str).unwrap_or("") == want
        })
    }
}

/// The collection and `namespace/name` key of one object's path
/// (`<group path>/namespaces/<ns>/<plural>/<name>`).
fn object_path(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.rsplitn(5, '/').collect();
    let [name, plural, ns, "namespaces", prefix] = parts.as_slice() else {
        return None;
    };
    Some((format!("{prefix}/{plural}"), format!("{ns}/{name}")))
}

/// The collection a request's path reads and the namespace it narrows to: a namespaced path
/// (`/api/v1/namespaces/<ns>/secrets`, what `Api::namespaced` asks for) is the cluster-wide
/// collection (`/api/v1/secrets`) in one namespace.
fn collection_of_path(path: &str) -> (String, Option<String>) {
    let parts: Vec<&str> = path.rsplitn(4, '/').collect();
    match parts.as_slice() {
        [plural, ns, "namespaces", prefix]
            if *prefix == "/api/v1" || prefix.starts_with("/apis/") =>
        {
            (format!("{prefix}/{plural}"), Some((*ns).to_string()))
        }
        _ => (path.to_string(), None),
    }
}

/// A running fake API server.
#[derive(Debug)]
pub struct ApiServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    /// Bumped to end every open watch.
    generation: watch::Sender<u64>,
    tasks: Mutex<Option<JoinSet<()>>>,
}

/// The collection path of an object, from its `apiVersion` and `kind`.
pub fn collection_of(api_version: &str, kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    // `policy` -> `policies`, but `gateway` -> `gateways` (a vowel before the `y`).
    let plural = match lower.strip_suffix('y') {
        Some(stem) if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) => format!("{stem}ies"),
        _ => format!("{lower}s"),
    };
    if api_version.contains('/') {
        format!("/apis/{api_version}/{plural}")
    } else {
        format!("/api/{api_version}/{plural}")
    }
}

fn key_of(v: &Value) -> String {
    let m = &v["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn collection_of_value(v: &Value) -> String {
    collection_of(
        v["apiVersion"].as_str().unwrap_or("v1"),
        v["kind"].as_str().unwrap_or(""),
    )
}

impl ApiServer {
    /// Serves the objects of the YAML `List`s in `texts` on a loopback port.
    pub async fn start(texts: &[&str]) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let items = texts
            .iter()
            .flat_map(|text| {
                let list: Value = serde_yaml_ng::from_str(text).unwrap();
                list["items"].as_array().cloned().unwrap_or_default()
            })
            .collect();
        Self::serve(listener, items).unwrap()
    }

    /// Serves `items` (objects, each with its `apiVersion`, `kind` and `metadata`) on
    /// `listener`, as `ferry lab api-server` serves a lab's recorded objects; fails only when
    /// the listener has no local address.
    pub fn serve(
        listener: tokio::net::TcpListener,
        items: Vec<Value>,
    ) -> std::io::Result<Arc<Self>> {
        let addr = listener.local_addr()?;
        let (changes, _) = broadcast::channel(4096);
        let (generation, _) = watch::channel(0);
        let server = Arc::new(Self {
            addr,
            state: Arc::new(Mutex::new(State::default())),
            changes,
            generation,
            tasks: Mutex::new(None),
        });
        for item in items {
            server.apply(item);
        }
        let mut tasks = JoinSet::new();
        let s = server.clone();
        tasks.spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        *server.tasks.lock() = Some(tasks);
        Ok(server)
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().unwrap();
        kube::Client::try_from(kube::Config::new(url)).unwrap()
    }

    /// A kube client for this server that sends `user` as its bearer token, which
    /// [`Self::writes`] names each of its writes by.
    pub fn client_as(&self, user: &str) -> kube::Client {
        let url = format!("http://{}", self.addr).parse().unwrap();
        let mut config = kube::Config::new(url);
        config.auth_info = serde_json::from_value(json!({ "token": user })).unwrap();
        kube::Client::try_from(config).unwrap()
    }

    /// Every write served so far, in order.
    pub fn writes(&self) -> Vec<Write> {
        self.state.lock().writes.clone()
    }

    /// Records a write `method` of `object` by the sender of `headers`.
    fn record(&self, method: &hyper::Method, headers: &hyper::HeaderMap, object: &Value) {
        let user = headers
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("anonymous")
            .to_string();
        self.state.lock().writes.push(Write {
            method: method.to_string(),
            kind: object["kind"].as_str().unwrap_or("").to_string(),
            key: key_of(object),
            user,
            object: object.clone(),
        });
    }

    /// Creates or replaces an object (ADDED or MODIFIED); the object as stored.
    pub fn apply(&self, object: Value) -> Value {
        let mut st = self.state.lock();
        self.apply_locked(&mut st, object)
    }

    fn apply_locked(&self, st: &mut State, mut object: Value) -> Value {
        let collection = collection_of_value(&object);
        let key = key_of(&object);
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let existed = st
            .collections
            .entry(collection.clone())
            .or_default()
            .insert(key, object.clone())
            .is_some();
        let change = Change {
            rv,
            collection,
            kind: if existed { "MODIFIED" } else { "ADDED" },
            object,
        };
        st.log.push(change.clone());
        let stored = change.object.clone();
        // Sent under the lock: watchers see changes in resourceVersion order.
        let _ = self.changes.send(change);
        stored
    }

    /// Applies every object of a YAML document.
    pub fn apply_yaml(&self, text: &str) {
        self.apply(serde_yaml_ng::from_str(text).unwrap());
    }

    /// Changes the stored object `api_version`/`kind` `ns/name` with `edit` (MODIFIED).
    pub fn edit(&self, api_version: &str, kind: &str, key: &str, edit: impl FnOnce(&mut Value)) {
        let collection = collection_of(api_version, kind);
        let mut object = self.state.lock().collections[&collection][key].clone();
        edit(&mut object);
        self.apply(object);
    }

    /// Deletes an object (DELETED).
    pub fn delete(&self, api_version: &str, kind: &str, key: &str) {
        let collection = collection_of(api_version, kind);
        let mut st = self.state.lock();
        let Some(mut object) = st
            .collections
            .get_mut(&collection)
            .and_then(|c| c.remove(key))
        else {
            return;
        };
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let change = Change {
            rv,
            collection,
            kind: "DELETED",
            object,
        };
        st.log.push(change.clone());
        drop(st);
        let _ = self.changes.send(change);
    }

    /// Forgets the history: a watch resumed from any earlier resourceVersion gets 410 Gone.
    pub fn compact(&self) {
        let mut st = self.state.lock();
        st.compacted = st.rv + 1;
        st.log.clear();
    }

    /// Ends every open watch stream (as an API server restart or a load balancer does).
    pub fn drop_watches(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Refuses the next requests for the collection of `api_version`/`kind` with these
    /// status codes, one each.
    pub fn refuse_next(&self, api_version: &str, kind: &str, codes: &[u16]) {
        self.state
            .lock()
            .refuse
            .entry(collection_of(api_version, kind))
            .or_default()
            .extend_from_slice(codes);
    }

    /// Requests served so far.
    pub fn requests(&self) -> u64 {
        self.state.lock().requests
    }

    /// Lists served so far.
    pub fn lists(&self) -> u64 {
        self.state.lock().lists
    }

    /// Watches answered with 410 Gone so far.
    pub fn gone(&self) -> u64 {
        self.state.lock().gone
    }

    /// Refusals not yet served.
    pub fn refusals_left(&self) -> usize {
        self.state.lock().refuse.values().map(Vec::len).sum()
    }

    /// Stops listening and closes every connection: the cluster is unreachable.
    pub fn stop(&self) {
        if let Some(mut t) = self.tasks.lock().take() {
            t.abort_all();
        }
        self.drop_watches();
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        let query: BTreeMap<String, String> = req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        {
            let mut st = self.state.lock();
            st.requests += 1;
            if let Some(codes) = st.refuse.get_mut(&path).filter(|c| !c.is_empty()) {
                let code = codes.remove(0);
                return status(code, "Refused", "refused by the test");
            }
        }
        let raw_query = req.uri().query().unwrap_or("").to_string();
        let method = req.method().clone();
        let headers = req.headers().clone();
        let response = match method {
            hyper::Method::PATCH if !path.ends_with("/status") => {
                Some(self.server_side_apply(&path, req).await)
            }
            hyper::Method::PATCH => Some(self.patch_status(&path, req).await),
            hyper::Method::DELETE => Some(self.delete_at(&path)),
            hyper::Method::POST => Some(self.create(&path, req).await),
            hyper::Method::PUT => Some(self.replace(&path, req).await),
            _ => None,
        };
        if let Some((code, object)) = response {
            if code.is_success() {
                self.record(&method, &headers, &object);
            }
            return json_response(code, &object);
        }
        if !query.contains_key("watch")
            && let Some((collection, key)) = object_path(&path)
        {
            return match self.stored(&collection, &key) {
                Some(object) => json_response(StatusCode::OK, &object),
                None => status(404, "NotFound", &format!("{key} not found")),
            };
        }
        let raw_query = raw_query.as_str();
        let selector =
            match FieldSelector::of_query(raw_query).and_then(|s| s.with_labels(raw_query)) {
                Ok(s) => s,
                Err(e) => return status(400, "BadRequest", &e),
            };
        let (path, namespace) = collection_of_path(&path);
        let selector = match namespace {
            Some(ns) => selector.in_namespace(&ns),
            None => selector,
        };
        let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        if watching {
            let from: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
            self.watch(path, from, bookmarks, selector)
        } else {
            self.list(&path, &selector)
        }
    }

    /// `PATCH <group path>/namespaces/<ns>/<plural>/<name>/status` with a JSON merge patch
    /// (RFC 7386): applied to the stored object, a MODIFIED event.
    async fn patch_status(&self, path: &str, req: Request<Incoming>) -> (StatusCode, Value) {
        let Some(rest) = path.strip_suffix("/status") else {
            return failure(405, "MethodNotAllowed", "only status is patched here");
        };
        let parts: Vec<&str> = rest.rsplitn(5, '/').collect();
        let [name, plural, ns, "namespaces", prefix] = parts.as_slice() else {
            return failure(404, "NotFound", "not a namespaced object");
        };
        let collection = format!("{prefix}/{plural}");
        let key = format!("{ns}/{name}");
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let Ok(body) = req.into_body().collect().await else {
            return failure(400, "BadRequest", "unreadable body");
        };
        let Ok(patch) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
            return failure(400, "BadRequest", "not JSON");
        };
        let current = self.stored(&collection, &key);
        let Some(mut object) = current else {
            return failure(404, "NotFound", "no such object");
        };
        json_patch::merge(&mut object, &patch);
        {
            let mut st = self.state.lock();
            st.patches += 1;
            st.patch_log.push(Patched {
                path: path.to_string(),
                content_type,
                body: patch,
            });
        }
        (StatusCode::OK, self.apply(object))
    }

    /// `PATCH <group path>/namespaces/<ns>/<plural>/<name>` as server-side apply
    /// (`application/apply-patch+yaml`, a whole object): created if absent, else merged into
    /// the stored object (a simplification of field ownership: the applier owns what it
    /// sends); an ADDED or MODIFIED event.
    async fn server_side_apply(&self, path: &str, req: Request<Incoming>) -> (StatusCode, Value) {
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if content_type != "application/apply-patch+yaml" {
            return failure(
                415,
                "UnsupportedMediaType",
                "only server-side apply is served here",
            );
        }
        let Some((collection, key)) = object_path(path) else {
            return failure(404, "NotFound", "not a namespaced object");
        };
        let Ok(body) = req.into_body().collect().await else {
            return failure(400, "BadRequest", "unreadable body");
        };
        let Ok(applied) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
            return failure(400, "BadRequest", "not JSON");
        };
        if collection_of_value(&applied) != collection || key_of(&applied) != key {
            return failure(
                400,
                "BadRequest",
                "the object is not the one the path names",
            );
        }
        let mut object = self.stored(&collection, &key).unwrap_or_else(|| json!({}));
        json_patch::merge(&mut object, &applied);
        self.state.lock().applies += 1;
        (StatusCode::OK, self.apply(object))
    }

    /// The stored object `key` of `collection`, if there is one.
    fn stored(&self, collection: &str, key: &str) -> Option<Value> {
        self.state
            .lock()
            .collections
            .get(collection)?
            .get(key)
            .cloned()
    }

    /// `DELETE <group path>/namespaces/<ns>/<plural>/<name>`: a DELETED event.
    fn delete_at(&self, path: &str) -> (StatusCode, Value) {
        let Some((collection, key)) = object_path(path) else {
            return failure(404, "NotFound", "not a namespaced object");
        };
        let object = self.stored(&collection, &key);
        let Some(object) = object else {
            return failure(404, "NotFound", "no such object");
        };
        self.delete(
            object["apiVersion"].as_str().unwrap_or("v1"),
            object["kind"].as_str().unwrap_or(""),
            &key,
        );
        (StatusCode::OK, object)
    }

    /// `POST <group path>/namespaces/<ns>/<plural>`: creates the object, `409 AlreadyExists`
    /// if there is one of its name; an ADDED event.
    async fn create(&self, path: &str, req: Request<Incoming>) -> (StatusCode, Value) {
        let (collection, namespace) = collection_of_path(path);
        let Some(object) = body_json(req).await else {
            return failure(400, "BadRequest", "not JSON");
        };
        if collection_of_value(&object) != collection
            || object["metadata"]["namespace"].as_str() != namespace.as_deref()
        {
            return failure(
                400,
                "BadRequest",
                "the object is not of the collection posted to",
            );
        }
        let key = key_of(&object);
        if self.stored(&collection, &key).is_some() {
            return failure(409, "AlreadyExists", &format!("{key} already exists"));
        }
        (StatusCode::CREATED, self.apply(object))
    }

    /// `PUT <group path>/namespaces/<ns>/<plural>/<name>`: replaces the object, `409
    /// Conflict` if the request's `metadata.resourceVersion` is not the stored one (optimistic
    /// concurrency, as the API server does it), `404` if there is none; a MODIFIED event.
    async fn replace(&self, path: &str, req: Request<Incoming>) -> (StatusCode, Value) {
        let Some((collection, key)) = object_path(path) else {
            return failure(404, "NotFound", "not a namespaced object");
        };
        let Some(object) = body_json(req).await else {
            return failure(400, "BadRequest", "not JSON");
        };
        if collection_of_value(&object) != collection || key_of(&object) != key {
            return failure(
                400,
                "BadRequest",
                "the object is not the one the path names",
            );
        }
        // One lock for the check and the write: two replaces of one version cannot both pass.
        let mut st = self.state.lock();
        let Some(stored) = st.collections.get(&collection).and_then(|c| c.get(&key)) else {
            return failure(404, "NotFound", &format!("{key} not found"));
        };
        let wanted = &object["metadata"]["resourceVersion"];
        if !wanted.is_null() && *wanted != stored["metadata"]["resourceVersion"] {
            return failure(
                409,
                "Conflict",
                &format!(
                    "{key}: the object has been modified; please apply your changes to the latest version and try again"
                ),
            );
        }
        (StatusCode::OK, self.apply_locked(&mut st, object))
    }

    /// Server-side applies served so far.
    pub fn applies(&self) -> u64 {
        self.state.lock().applies
    }

    /// Status patches served so far.
    pub fn patches(&self) -> u64 {
        self.state.lock().patches
    }

    /// Every patch served so far, in order.
    pub fn patch_log(&self) -> Vec<Patched> {
        self.state.lock().patch_log.clone()
    }

    /// The stored object `api_version`/`kind` `ns/name`, if any.
    pub fn get(&self, api_version: &str, kind: &str, key: &str) -> Option<Value> {
        self.state
            .lock()
            .collections
            .get(&collection_of(api_version, kind))
            .and_then(|c| c.get(key))
            .cloned()
    }

    fn list(&self, path: &str, selector: &FieldSelector) -> Response<Body> {
        let mut st = self.state.lock();
        st.lists += 1;
        let items: Vec<Value> = st
            .collections
            .get(path)
            .map(|c| {
                c.values()
                    .filter(|v| selector.matches(v))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let body = json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": st.rv.to_string()},
            "items": items,
        });
        json_response(StatusCode::OK, &body)
    }

    fn watch(
        self: &Arc<Self>,
        path: String,
        from: u64,
        bookmarks: bool,
        selector: FieldSelector,
    ) -> Response<Body> {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let mut live = self.changes.subscribe();
        let mut generation = self.generation.subscribe();
        let (backlog, gone, now) = {
            let mut st = self.state.lock();
            let gone = from != 0 && from < st.compacted;
            st.gone += u64::from(gone);
            let backlog: Vec<Change> = st
                .log
                .iter()
                .filter(|c| c.rv > from && c.collection == path && selector.matches(&c.object))
                .cloned()
                .collect();
            (backlog, gone, st.rv)
        };
        tokio::spawn(async move {
            let line = |v: Value| Bytes::from(format!("{v}\n"));
            if gone {
                let _ = tx
                    .send(line(json!({"type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "Expired", "code": 410,
                        "message": format!("too old resource version: {from}"),
                    }})))
                    .await;
                return;
            }
            let mut sent = from;
            for c in backlog {
                sent = c.rv;
                if tx
                    .send(line(json!({"type": c.kind, "object": c.object})))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if bookmarks {
                let bm = json!({"type": "BOOKMARK", "object": {
                    "kind": "Bookmark", "apiVersion": "v1",
                    "metadata": {"resourceVersion": now.max(sent).to_string()},
                }});
                if tx.send(line(bm)).await.is_err() {
                    return;
                }
            }
            loop {
                // A dropped watch delivers nothing more, even a change already queued.
                tokio::select! {
                    biased;
                    _ = generation.changed() => return,
                    c = live.recv() => match c {
                        Ok(c) if c.collection == path && c.rv > sent && selector.matches(&c.object) => {
                            sent = c.rv;
                            if tx.send(line(json!({"type": c.kind, "object": c.object}))).await.is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    },
                    () = tokio::time::sleep(Duration::from_secs(300)) => return,
                }
            }
        });
        let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(StreamBody::new(stream).boxed())
            .unwrap()
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

/// A request's body as JSON, if it is.
async fn body_json(req: Request<Incoming>) -> Option<Value> {
    let body = req.into_body().collect().await.ok()?;
    serde_json::from_slice(&body.to_bytes()).ok()
}

/// A failure `Status` object.
fn failure(code: u16, reason: &str, message: &str) -> (StatusCode, Value) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code,
    });
    (StatusCode::from_u16(code).unwrap(), body)
}

fn status(code: u16, reason: &str, message: &str) -> Response<Body> {
    let (code, body) = failure(code, reason, message);
    json_response(code, &body)
}
