//! The SQS partial batch response, pinned as the exact JSON Lambda reads.

use aws_lambda_events::event::sqs::SqsEvent;
use sandbox_lambda::batch_response::{ItemOutcome, is_fifo_batch, partial_batch_response};

const A: &str = "0b6e2f1a-93c4-4d5e-8f7a-1c2b3d4e5f60";
const B: &str = "7d3a9c5e-1f2b-4a6c-9e8d-0b1a2c3d4e5f";
const C: &str = "c1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f";

fn json(outcomes: [ItemOutcome; 3], fifo: bool) -> String {
    let response = partial_batch_response([A, B, C].into_iter().zip(outcomes), fifo);
    serde_json::to_string(&response).unwrap()
}

use ItemOutcome::{Failed, NotAttempted, Succeeded};

#[test]
fn all_ok_batch_serializes_an_empty_failure_list() {
    assert_eq!(json([Succeeded; 3], false), r#"{"batchItemFailures":[]}"#);
    assert_eq!(json([Succeeded; 3], true), r#"{"batchItemFailures":[]}"#);
}

#[test]
fn standard_queue_with_the_second_of_three_failing_reports_only_the_second() {
    assert_eq!(
        json([Succeeded, Failed, Succeeded], false),
        format!(r#"{{"batchItemFailures":[{{"itemIdentifier":"{B}"}}]}}"#)
    );
}

#[test]
fn fifo_queue_with_the_second_of_three_failing_reports_the_second_and_third() {
    assert_eq!(
        json([Succeeded, Failed, Succeeded], true),
        format!(
            r#"{{"batchItemFailures":[{{"itemIdentifier":"{B}"}},{{"itemIdentifier":"{C}"}}]}}"#
        )
    );
}

#[test]
fn not_attempted_messages_are_reported_on_standard_queues_too() {
    assert_eq!(
        json([Succeeded, Succeeded, NotAttempted], false),
        format!(r#"{{"batchItemFailures":[{{"itemIdentifier":"{C}"}}]}}"#)
    );
}

#[test]
fn fifo_queue_with_the_first_failing_reports_the_whole_batch_in_order() {
    assert_eq!(
        json([Failed, Succeeded, Succeeded], true),
        format!(
            r#"{{"batchItemFailures":[{{"itemIdentifier":"{A}"}},{{"itemIdentifier":"{B}"}},{{"itemIdentifier":"{C}"}}]}}"#
        )
    );
}

fn fixture_batch() -> SqsEvent {
    let path = format!(
        "{}/../../events/lambda/sqs_fifo.jobs.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn fixture_batch_with_message_group_ids_is_fifo() {
    assert!(is_fifo_batch(&fixture_batch()));
}

#[test]
fn batch_without_group_ids_from_a_standard_queue_is_not_fifo() {
    let mut event = fixture_batch();
    for r in &mut event.records {
        r.attributes.remove("MessageGroupId");
        r.event_source_arn =
            Some("arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-timers".into());
    }
    assert!(!is_fifo_batch(&event));
    // The ARN alone is enough to recognise a FIFO queue.
    event.records[0].event_source_arn =
        Some("arn:aws:sqs:us-east-1:123456789012:sandbox-lifecycle-jobs.fifo".into());
    assert!(is_fifo_batch(&event));
}

/// A deferred message (its job sent again as a new message, worker_handler.rs `defer`) is
/// never reported, even after a FIFO failure: Lambda deletes it.
#[test]
fn deferred_messages_are_never_reported_even_after_a_fifo_failure() {
    use ItemOutcome::Deferred;
    for fifo in [false, true] {
        assert_eq!(
            json([Failed, Deferred, Deferred], fifo),
            format!(r#"{{"batchItemFailures":[{{"itemIdentifier":"{A}"}}]}}"#)
        );
        assert_eq!(
            json([Succeeded, Deferred, NotAttempted], fifo),
            format!(r#"{{"batchItemFailures":[{{"itemIdentifier":"{C}"}}]}}"#)
        );
    }
}
