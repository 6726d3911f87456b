//! load_sdk_config: the region from the environment, the endpoint override.

use crate::support::{endpoint, sdk};

#[tokio::test]
async fn the_config_takes_the_region_from_the_environment_and_the_endpoint_override() {
    let config = sdk().await;
    // tests/moto/run.sh exports AWS_REGION=us-east-1 (also the fallback).
    assert_eq!(config.region().map(|r| r.as_ref()), Some("us-east-1"));
    assert_eq!(config.endpoint_url(), Some(endpoint().as_str()));
    let production = sandbox_aws::load_sdk_config(None).await;
    assert_eq!(production.endpoint_url(), None);
}
