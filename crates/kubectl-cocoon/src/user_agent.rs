//! The `User-Agent` of the plugin's clients (`kubectl cocoon`): the API server's audit log and
//! API priority-and-fairness tell its requests apart by it, and the registry's access log (for
//! `registry gc`) does the same.

/// `kubectl-cocoon/<version>`.
pub const USER_AGENT: &str = concat!("kubectl-cocoon/", env!("CARGO_PKG_VERSION"));

/// `config` with [`USER_AGENT`] as the `User-Agent` of every request (replacing any other).
pub fn kube_config(mut config: kube::Config) -> kube::Config {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    config
}

/// `config` with [`USER_AGENT`] on every registry request.
pub fn registry_config(config: cocoon_registry::RegistryConfig) -> cocoon_registry::RegistryConfig {
    config.with_user_agent(USER_AGENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_binary_and_version_once() {
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static("other/1"),
        ));
        let config = kube_config(config);
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        assert_eq!(
            agents,
            [format!("kubectl-cocoon/{}", env!("CARGO_PKG_VERSION"))]
        );
    }
}
