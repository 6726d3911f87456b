//! The cold start: SDK clients, adapters and the controller, built once per execution
//! environment from the [`settings`](crate::settings) and reused by every invocation.

use crate::secrets_at_init::SecretInitError;
use crate::settings::SettingsError;
#[cfg(feature = "webhook")]
use crate::settings::WebhookSettings;

/// Why a cold start failed. One line, naming the variable (and ARN), never a secret.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A setting is missing or invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// A secret is unreadable or unusable.
    #[error(transparent)]
    Secret(#[from] SecretInitError),
    /// The Agents API client refused its configuration (`AGENTS_API_BASE_URL`).
    #[error("AGENTS_API_BASE_URL: {0}")]
    AgentsClient(#[from] sandbox_agents_api::ConfigError),
}

/// A queue adapter for `url`.
#[cfg(any(feature = "webhook", feature = "controller"))]
fn sqs_queue(
    client: &aws_sdk_sqs::Client,
    url: &str,
    fifo: bool,
    dead_letter_queue_url: Option<String>,
) -> sandbox_aws::SqsQueue {
    sandbox_aws::SqsQueue::new(
        client.clone(),
        url,
        sandbox_aws::SqsQueueOptions {
            fifo,
            dead_letter_queue_url,
        },
    )
}

/// The webhook intake: the signing secret from Secrets Manager, the events queue, the
/// system clock.
///
/// # Errors
/// [`InitError::Secret`] when the secret is unreadable or unusable.
#[cfg(feature = "webhook")]
pub async fn webhook_intake(
    settings: &WebhookSettings,
) -> Result<sandbox_controller::Intake<sandbox_aws::SqsQueue>, InitError> {
    let sdk = sandbox_aws::load_sdk_config(settings.aws_endpoint_url.as_deref()).await;
    let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
    let verifier = crate::secrets_at_init::read_webhook_verifiers(
        &secrets,
        &settings.webhook_secret,
        settings.previous_webhook_secret.as_ref(),
    )
    .await?
    .with_tolerance_secs(settings.tolerance_secs);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let events = sqs_queue(
        &sqs,
        &settings.events_queue_url,
        settings.events_queue_fifo,
        None,
    );
    Ok(sandbox_controller::Intake::new(
        verifier,
        events,
        std::sync::Arc::new(sandbox_controller::ports::SystemClock),
    )
    .with_provision_on(settings.provision_on))
}

#[cfg(feature = "controller")]
pub use controller_stack::{AwsController, SweeperController, controller, sweeper_controller};

#[cfg(feature = "controller")]
mod controller_stack {
    use super::{InitError, sqs_queue};
    use crate::settings::ControllerSettings;
    use sandbox_agents_api::{AgentsClient, ClientConfig, SessionsApi};
    use sandbox_aws::{DynamoRegistry, EcsCompute, SqsQueue};
    use sandbox_controller::ports::SystemClock;
    use sandbox_controller::{Controller, NoSessions};
    use std::sync::Arc;

    /// The worker's controller over the AWS adapters, with the Agents API client.
    pub type AwsController = Controller<SqsQueue, DynamoRegistry, EcsCompute, AgentsClient>;

    /// The sweeper's controller: the same adapters and no Agents API key ([`NoSessions`]:
    /// a sweep reads no session; the jobs it fans out are decided by the worker).
    pub type SweeperController = Controller<SqsQueue, DynamoRegistry, EcsCompute, NoSessions>;

    /// The worker's controller: the API key from Secrets Manager (`OPENAI_API_KEY_SECRET_ARN`,
    /// required here), both queues, the registry table, ECS, the Agents API client.
    ///
    /// # Errors
    /// [`InitError`] when `OPENAI_API_KEY_SECRET_ARN` is unset, the API key is unreadable
    /// or unusable, or the Agents API client refuses its configuration.
    pub async fn controller(settings: &ControllerSettings) -> Result<AwsController, InitError> {
        let sdk = sandbox_aws::load_sdk_config(settings.aws_endpoint_url.as_deref()).await;
        let secrets = aws_sdk_secretsmanager::Client::new(&sdk);
        let api_key =
            crate::secrets_at_init::read_api_key(&secrets, settings.api_key_secret()?).await?;
        let sessions = AgentsClient::new(ClientConfig {
            base_url: settings.agents_api_base_url.clone(),
            api_key,
            ..ClientConfig::new(String::new())
        })?;
        // Forced operator jobs for unrecorded sessions verify with this key (docs/SECURITY.md,
        // "Security"); without it every such job is refused.
        let operator_key = match &settings.operator_key_secret {
            Some(source) => {
                Some(crate::secrets_at_init::read_operator_key(&secrets, source).await?)
            }
            None => None,
        };
        let mut settings = settings.clone();
        settings.controller.operator_key = operator_key;
        Ok(assemble(&sdk, &settings, sessions)?)
    }

    /// The sweeper's controller: the queues, the registry table, ECS; no secret is read
    /// and no Agents API client is built (its role grants no `GetSecretValue`).
    ///
    /// # Errors
    /// [`InitError::Settings`] when the ECS or workspace settings are unusable.
    pub async fn sweeper_controller(
        settings: &ControllerSettings,
    ) -> Result<SweeperController, InitError> {
        let sdk = sandbox_aws::load_sdk_config(settings.aws_endpoint_url.as_deref()).await;
        Ok(assemble(&sdk, settings, NoSessions)?)
    }

    /// The adapters both functions share, around `sessions`.
    fn assemble<S: SessionsApi>(
        sdk: &aws_config::SdkConfig,
        settings: &ControllerSettings,
        sessions: S,
    ) -> Result<Controller<SqsQueue, DynamoRegistry, EcsCompute, S>, crate::settings::SettingsError>
    {
        let sqs = aws_sdk_sqs::Client::new(sdk);
        let events = sqs_queue(
            &sqs,
            &settings.events_queue_url,
            settings.events_queue_fifo,
            settings.events_dlq_url.clone(),
        );
        let timers = sqs_queue(&sqs, &settings.timers_queue_url, false, None);
        let sweep = sqs_queue(&sqs, &settings.sweep_queue_url, false, None);
        let registry =
            DynamoRegistry::new(aws_sdk_dynamodb::Client::new(sdk), &settings.table_name)
                .with_history_retention(settings.history_retention_secs);
        // ECS, plus EBS workspaces when ECS_INFRASTRUCTURE_ROLE_ARN is set.
        // A claim of a warm pool member is fenced by the environment's registry lock.
        let compute: EcsCompute = settings
            .ecs
            .compute(sdk)?
            .with_claim_fence(&settings.table_name);
        Ok(Controller::new(
            events,
            timers,
            registry,
            compute,
            sessions,
            Arc::new(SystemClock),
            settings.controller.clone(),
        )
        .with_sweep_queue(sweep))
    }
}
