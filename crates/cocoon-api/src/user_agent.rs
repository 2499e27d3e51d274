//! The `User-Agent` each binary's clients send (`cocoon-operator/<version>`,
//! `cocoon-node/<version>`, `kubectl-cocoon/<version>`): the API server's audit log and API
//! priority-and-fairness tell our requests apart by it, and the registry's access log does the
//! same. Each binary names its own agent; this is the one way it is put on a client.

use http::{HeaderName, HeaderValue, header::USER_AGENT};

/// Puts `agent` as the only `User-Agent` in a client's default headers (kube's
/// `Config::headers`), replacing any other.
pub fn set(headers: &mut Vec<(HeaderName, HeaderValue)>, agent: &'static str) {
    headers.retain(|(name, _)| name != USER_AGENT);
    headers.push((USER_AGENT, HeaderValue::from_static(agent)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_replaces_any_other_once() {
        let mut headers = vec![
            (USER_AGENT, HeaderValue::from_static("other/1")),
            (http::header::ACCEPT, HeaderValue::from_static("*/*")),
        ];
        set(&mut headers, "cocoon-node/1.2.3");
        let agents: Vec<_> = headers
            .iter()
            .filter(|(n, _)| n == USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap_or_default())
            .collect();
        assert_eq!(agents, ["cocoon-node/1.2.3"]);
        assert_eq!(headers.len(), 2, "other headers stay");
    }
}
