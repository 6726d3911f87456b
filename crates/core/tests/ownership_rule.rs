//! The metadata ownership rule as a setting (F3): parsing `key=value` entries.

use sandbox_core::observed::{MetadataRuleError, parse_metadata_rule};

#[test]
fn metadata_rule_parses_pairs_and_refuses_bad_input() {
    let rule = parse_metadata_rule(["owner=team-a", " tier = gold ", "empty="]).unwrap();
    assert_eq!(rule.len(), 3);
    assert_eq!(rule["owner"], "team-a");
    assert_eq!(rule["tier"], "gold");
    assert_eq!(rule["empty"], "");
    // A value may hold `=`: the split is at the first one.
    assert_eq!(parse_metadata_rule(["k=a=b"]).unwrap()["k"], "a=b");
    assert!(parse_metadata_rule([]).unwrap().is_empty());

    assert_eq!(
        parse_metadata_rule(["owner"]),
        Err(MetadataRuleError::NotAPair)
    );
    assert_eq!(
        parse_metadata_rule(["=x"]),
        Err(MetadataRuleError::NotAPair)
    );
    assert_eq!(
        parse_metadata_rule(["a=1", "a=2"]),
        Err(MetadataRuleError::DuplicateKey)
    );
    let long_key = format!("{}=v", "k".repeat(65));
    assert_eq!(
        parse_metadata_rule([long_key.as_str()]),
        Err(MetadataRuleError::TooLong)
    );
    let long_value = format!("k={}", "v".repeat(513));
    assert_eq!(
        parse_metadata_rule([long_value.as_str()]),
        Err(MetadataRuleError::TooLong)
    );
    let many: Vec<String> = (0..17).map(|i| format!("k{i}=v")).collect();
    assert_eq!(
        parse_metadata_rule(many.iter().map(String::as_str)),
        Err(MetadataRuleError::TooMany)
    );
    let sixteen: Vec<String> = (0..16).map(|i| format!("k{i}=v")).collect();
    assert_eq!(
        parse_metadata_rule(sixteen.iter().map(String::as_str))
            .unwrap()
            .len(),
        16
    );
}
