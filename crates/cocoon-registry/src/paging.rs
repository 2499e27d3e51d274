//! Bounds on paginated listings (`GET /v2/_catalog`, `GET /v2/<R>/tags/list`): the client
//! follows `Link: <…>; rel="next"` headers, and a registry (or whatever answers in its name)
//! decides how many pages there are. Without a bound, a `Link` that points back at an earlier
//! page loops for ever and a huge listing grows the caller's memory without end.
//!
//! [`PageWalk`] is the pure rule: at most [`ListLimits::max_pages`] pages, at most
//! [`ListLimits::max_entries`] entries in all, and no page fetched twice. Exceeding any of
//! them is [`Error::ListLimit`] naming the limit and its environment variable.

use url::Url;

use crate::error::{Error, Result};

/// Environment variable: most pages one listing follows (default [`DEFAULT_MAX_PAGES`]).
pub const ENV_LIST_MAX_PAGES: &str = "OCI_REGISTRY_LIST_MAX_PAGES";
/// Environment variable: most entries one listing collects (default [`DEFAULT_MAX_ENTRIES`]).
pub const ENV_LIST_MAX_ENTRIES: &str = "OCI_REGISTRY_LIST_MAX_ENTRIES";
/// Default of [`ListLimits::max_pages`].
pub const DEFAULT_MAX_PAGES: usize = 1000;
/// Default of [`ListLimits::max_entries`].
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;
/// Default of [`ListLimits::page_size`] (the `n` query parameter of the first request).
pub const DEFAULT_PAGE_SIZE: usize = 1000;

/// How far one listing may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListLimits {
    /// The `n` asked of the registry for each page.
    pub page_size: usize,
    /// Most pages followed ([`ENV_LIST_MAX_PAGES`]).
    pub max_pages: usize,
    /// Most entries collected over all pages ([`ENV_LIST_MAX_ENTRIES`]).
    pub max_entries: usize,
}

impl Default for ListLimits {
    fn default() -> Self {
        ListLimits {
            page_size: DEFAULT_PAGE_SIZE,
            max_pages: DEFAULT_MAX_PAGES,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl ListLimits {
    /// Reads [`ENV_LIST_MAX_PAGES`] and [`ENV_LIST_MAX_ENTRIES`] (unset or blank: default;
    /// anything but a positive integer is an error naming the variable).
    pub fn from_env_with(env: &dyn Fn(&str) -> Option<String>) -> Result<ListLimits> {
        let knob = |name: &str, default: usize| -> Result<usize> {
            match env(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(Error::invalid(
                        name,
                        format!("{v:?} is not a positive integer"),
                    )),
                },
            }
        };
        Ok(ListLimits {
            page_size: DEFAULT_PAGE_SIZE,
            max_pages: knob(ENV_LIST_MAX_PAGES, DEFAULT_MAX_PAGES)?,
            max_entries: knob(ENV_LIST_MAX_ENTRIES, DEFAULT_MAX_ENTRIES)?,
        })
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.page_size == 0 || self.max_pages == 0 || self.max_entries == 0 {
            return Err(Error::invalid(
                "list_limits",
                "page size, page cap and entry cap must be at least 1",
            ));
        }
        Ok(())
    }
}

/// The state of one paginated listing: the pages fetched so far and the entries collected.
#[derive(Debug)]
pub struct PageWalk {
    what: String,
    limits: ListLimits,
    /// Every page URL fetched (at most `max_pages`, so this stays bounded).
    seen: Vec<Url>,
    entries: usize,
}

impl PageWalk {
    /// A walk of the listing `what` (`catalog`, `tags of <repo>`) under `limits`.
    pub fn new(what: impl Into<String>, limits: ListLimits) -> PageWalk {
        PageWalk {
            what: what.into(),
            limits,
            seen: Vec::new(),
            entries: 0,
        }
    }

    /// Called before fetching `url`: refuses a page past the cap and a page already fetched
    /// (a `Link` loop).
    pub fn visit(&mut self, url: &Url) -> Result<()> {
        if self.seen.iter().any(|u| u == url) {
            return Err(Error::ListLimit {
                what: self.what.clone(),
                reason: format!(
                    "the registry's Link header leads back to a page already read ({}); \
                     refusing to loop",
                    url.path()
                ),
            });
        }
        if self.seen.len() >= self.limits.max_pages {
            return Err(Error::ListLimit {
                what: self.what.clone(),
                reason: format!(
                    "more than {} pages (limit {ENV_LIST_MAX_PAGES})",
                    self.limits.max_pages
                ),
            });
        }
        self.seen.push(url.clone());
        Ok(())
    }

    /// Called with the number of entries a page brought: refuses once the total passes the
    /// entry cap.
    pub fn add_entries(&mut self, n: usize) -> Result<()> {
        self.entries = self.entries.saturating_add(n);
        if self.entries > self.limits.max_entries {
            return Err(Error::ListLimit {
                what: self.what.clone(),
                reason: format!(
                    "more than {} entries (limit {ENV_LIST_MAX_ENTRIES})",
                    self.limits.max_entries
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(&format!("http://r.example{s}")).expect("url")
    }

    fn limits(max_pages: usize, max_entries: usize) -> ListLimits {
        ListLimits {
            page_size: 2,
            max_pages,
            max_entries,
        }
    }

    #[test]
    fn a_link_loop_is_refused_at_the_first_repeat() {
        let mut w = PageWalk::new("tags of x", limits(100, 1000));
        w.visit(&url("/v2/x/tags/list?n=2")).expect("first page");
        w.visit(&url("/v2/x/tags/list?last=b&n=2"))
            .expect("second page");
        let err = w
            .visit(&url("/v2/x/tags/list?n=2"))
            .expect_err("same page twice");
        assert!(
            err.to_string()
                .starts_with("list tags of x: the registry's Link header leads back"),
            "{err}"
        );
        assert_eq!(err.class(), crate::ErrorClass::Protocol);
        // The same page as its own next is a loop too.
        let mut w = PageWalk::new("catalog", limits(100, 1000));
        w.visit(&url("/v2/_catalog?n=2")).expect("first");
        assert!(w.visit(&url("/v2/_catalog?n=2")).is_err());
    }

    #[test]
    fn the_page_and_entry_caps_stop_a_walk() {
        let mut w = PageWalk::new("catalog", limits(2, 1000));
        w.visit(&url("/v2/_catalog?n=2")).expect("1");
        w.visit(&url("/v2/_catalog?last=b&n=2")).expect("2");
        let err = w
            .visit(&url("/v2/_catalog?last=d&n=2"))
            .expect_err("third page");
        assert_eq!(
            err.to_string(),
            "list catalog: more than 2 pages (limit OCI_REGISTRY_LIST_MAX_PAGES)"
        );

        let mut w = PageWalk::new("catalog", limits(100, 3));
        w.add_entries(2).expect("2");
        w.add_entries(1).expect("3 is the cap");
        let err = w.add_entries(1).expect_err("4");
        assert_eq!(
            err.to_string(),
            "list catalog: more than 3 entries (limit OCI_REGISTRY_LIST_MAX_ENTRIES)"
        );
    }

    #[test]
    fn limits_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(pk, _)| *pk == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        assert_eq!(
            ListLimits::from_env_with(&env(&[])).expect("defaults"),
            ListLimits::default()
        );
        let l = ListLimits::from_env_with(&env(&[
            (ENV_LIST_MAX_PAGES, " 7 "),
            (ENV_LIST_MAX_ENTRIES, "70"),
        ]))
        .expect("set");
        assert_eq!((l.max_pages, l.max_entries), (7, 70));
        for bad in ["0", "-1", "many"] {
            let pairs: &'static [(&'static str, &'static str)] = match bad {
                "0" => &[(ENV_LIST_MAX_PAGES, "0")],
                "-1" => &[(ENV_LIST_MAX_ENTRIES, "-1")],
                _ => &[(ENV_LIST_MAX_PAGES, "many")],
            };
            let err = ListLimits::from_env_with(&env(pairs)).expect_err(bad);
            assert!(
                err.to_string().starts_with("OCI_REGISTRY_LIST_MAX_"),
                "{err}"
            );
        }
    }
}
