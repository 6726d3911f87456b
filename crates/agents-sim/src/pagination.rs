//! Cursor pages: `after`, `limit` (1..=100, default 20) and `order` (`asc`/`desc`,
//! default `desc`), as the official SDK's list params describe them.

use crate::error::ApiError;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest page size.
pub const MAX_LIMIT: usize = 100;

/// Parsed cursor parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PageQuery {
    pub after: Option<String>,
    pub limit: usize,
    pub ascending: bool,
}

/// Reads `after`, `limit` and `order` from query pairs (others are ignored here).
pub(crate) fn parse(pairs: &[(String, String)]) -> Result<PageQuery, ApiError> {
    let mut q = PageQuery {
        after: None,
        limit: DEFAULT_LIMIT,
        ascending: false,
    };
    for (k, v) in pairs {
        match k.as_str() {
            "after" if !v.is_empty() => q.after = Some(v.clone()),
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("limit must be an integer between 1 and {MAX_LIMIT}"),
                            Some("limit"),
                        )
                    })?;
            }
            "order" => {
                q.ascending = match v.as_str() {
                    "asc" => true,
                    "desc" => false,
                    _ => {
                        return Err(ApiError::invalid(
                            "order must be 'asc' or 'desc'",
                            Some("order"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(q)
}

/// One page of `entries` (in ascending creation order; `None` marks an entry that is
/// hidden, e.g. deleted, but still valid as a cursor). Returns the page and `has_more`.
///
/// # Errors
/// 400 when `after` names no entry.
pub(crate) fn paginate<T>(
    entries: Vec<(String, Option<T>)>,
    q: &PageQuery,
) -> Result<(Vec<T>, bool), ApiError> {
    let mut entries = entries;
    if !q.ascending {
        entries.reverse();
    }
    let start = match &q.after {
        None => 0,
        Some(after) => {
            entries
                .iter()
                .position(|(id, _)| id == after)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("no object with id '{after}' to page after"),
                        Some("after"),
                    )
                })?
                + 1
        }
    };
    let mut visible = entries.into_iter().skip(start).filter_map(|(_, v)| v);
    let page: Vec<T> = visible.by_ref().take(q.limit).collect();
    let has_more = visible.next().is_some();
    Ok((page, has_more))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn entries(n: usize) -> Vec<(String, Option<usize>)> {
        (0..n).map(|i| (format!("id{i}"), Some(i))).collect()
    }

    #[test]
    fn defaults_and_bounds() {
        let q = parse(&[]).unwrap();
        assert_eq!((q.limit, q.ascending, q.after), (20, false, None));
        assert!(parse(&pairs(&[("limit", "0")])).is_err());
        assert!(parse(&pairs(&[("limit", "101")])).is_err());
        assert!(parse(&pairs(&[("order", "sideways")])).is_err());
    }

    #[test]
    fn pages_desc_and_asc_with_cursor() {
        let q = parse(&pairs(&[("limit", "2")])).unwrap();
        let (p, more) = paginate(entries(5), &q).unwrap();
        assert_eq!((p, more), (vec![4, 3], true));
        let q = parse(&pairs(&[
            ("limit", "2"),
            ("order", "asc"),
            ("after", "id2"),
        ]))
        .unwrap();
        let (p, more) = paginate(entries(5), &q).unwrap();
        assert_eq!((p, more), (vec![3, 4], false));
        let q = parse(&pairs(&[("after", "nope")])).unwrap();
        assert!(paginate(entries(5), &q).is_err());
    }

    #[test]
    fn hidden_entries_are_cursors_but_not_listed() {
        let mut e = entries(4);
        e[2].1 = None;
        let q = parse(&pairs(&[("order", "asc"), ("after", "id2")])).unwrap();
        assert_eq!(paginate(e.clone(), &q).unwrap().0, vec![3]);
        let q = parse(&pairs(&[("order", "asc")])).unwrap();
        assert_eq!(paginate(e, &q).unwrap().0, vec![0, 1, 3]);
    }
}
