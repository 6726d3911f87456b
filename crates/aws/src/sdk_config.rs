//! Loading the shared AWS SDK configuration.

use aws_config::environment::EnvironmentVariableRegionProvider;
use aws_config::meta::region::RegionProviderChain;
use aws_config::{BehaviorVersion, Region, SdkConfig};

/// The region used when the environment names none.
pub const DEFAULT_REGION: &str = "us-east-1";

/// Loads the SDK configuration every client of this crate is built from.
///
/// - Region: `AWS_REGION`, then `AWS_DEFAULT_REGION` (Lambda sets `AWS_REGION`), else
///   [`DEFAULT_REGION`]. Profiles and instance metadata are not consulted for the region,
///   so start-up never waits on an IMDS timeout off AWS.
/// - Credentials: the SDK's default chain (environment, web identity, ECS/Lambda
///   container credentials, profile, IMDS), resolved lazily on the first call.
/// - `endpoint_url`: an override for every service (moto in tests:
///   `http://127.0.0.1:PORT`). `None` in production: the SDK derives each endpoint.
/// - Retries: the SDK's standard mode (3 attempts with jittered backoff on throttling,
///   5xx and connection errors); timeouts: the SDK defaults (3.1 s connect).
pub async fn load_sdk_config(endpoint_url: Option<&str>) -> SdkConfig {
    let region = RegionProviderChain::first_try(EnvironmentVariableRegionProvider::new())
        .or_else(Region::new(DEFAULT_REGION));
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(region);
    if let Some(url) = endpoint_url {
        loader = loader.endpoint_url(url);
    }
    loader.load().await
}
