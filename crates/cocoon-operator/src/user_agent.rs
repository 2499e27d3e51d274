//! The `User-Agent` of `cocoon-operator run`'s clients (see [`cocoon_api::user_agent`]).

/// `cocoon-operator/<version>`.
pub const USER_AGENT: &str = concat!("cocoon-operator/", env!("CARGO_PKG_VERSION"));

/// `config` with [`USER_AGENT`] as the `User-Agent` of every request (replacing any other).
pub fn kube_config(mut config: kube::Config) -> kube::Config {
    cocoon_api::user_agent::set(&mut config.headers, USER_AGENT);
    config
}

/// `config` with [`USER_AGENT`] on every registry request.
pub fn registry_config(config: cocoon_registry::RegistryConfig) -> cocoon_registry::RegistryConfig {
    config.with_user_agent(USER_AGENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_the_binary_and_version_once() {
        let url = "https://127.0.0.1:6443".parse().expect("url");
        let config = super::kube_config(kube::Config::new(url));
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap_or_default())
            .collect();
        assert_eq!(
            agents,
            [format!("cocoon-operator/{}", env!("CARGO_PKG_VERSION"))]
        );
    }
}
