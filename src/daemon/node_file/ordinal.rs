//! A node's id from its StatefulSet pod's name (`id_from_env`): the pod `NAME-N` is node
//! N + 1, so one node file serves every pod.

/// The id of the node whose name, in environment variable `var` (`value`), ends with `-N`:
/// N + 1 (a StatefulSet's pod `ratemesh-0` is node 1).
pub(super) fn ordinal_id(var: &str, value: Option<&str>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("the environment variable {var} is not set"))?;
    let ordinal = value
        .rsplit_once('-')
        .map(|(_, n)| n)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|&n| n < crate::ids::MAX_NODE_ID)
        .ok_or_else(|| {
            format!(
                "{var} is `{}`: not a name ending in `-N` (a StatefulSet's pod, e.g. `ratemesh-0`)",
                value.escape_debug()
            )
        })?;
    Ok(ordinal + 1)
}

#[cfg(test)]
mod tests {
    use super::ordinal_id;

    #[test]
    fn a_pods_ordinal_gives_its_id() {
        assert_eq!(ordinal_id("POD_NAME", Some("ratemesh-0")), Ok(1));
        assert_eq!(ordinal_id("POD_NAME", Some("my-gateway-12")), Ok(13));
        for bad in ["ratemesh", "ratemesh-", "ratemesh-1a", "ratemesh-+1"] {
            let error = ordinal_id("POD_NAME", Some(bad)).unwrap_err();
            assert!(error.contains(bad) && error.contains("-N"), "{error}");
        }
        let huge = format!("r-{}", u64::MAX);
        assert!(ordinal_id("POD_NAME", Some(&huge)).is_err());
        assert_eq!(
            ordinal_id("POD_NAME", None),
            Err("the environment variable POD_NAME is not set".to_owned())
        );
    }
}
