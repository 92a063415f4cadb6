//! Coalescing of the events that wake every policy loop: the first wakes at once, later ones
//! within `every` of the last wake become a single wake at the end of that interval.

use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};

/// At most one item per `every`, never later than `every` after the event that caused it; an
/// event with nothing before it passes at once.
pub fn throttle<S>(events: S, every: Duration) -> impl Stream<Item = ()> + Send
where
    S: Stream<Item = ()> + Send + 'static,
{
    let state = (events.boxed(), None::<tokio::time::Instant>);
    futures::stream::unfold(state, move |(mut events, last)| async move {
        events.next().await?;
        if let Some(last) = last {
            tokio::time::sleep_until(last + every).await;
        }
        // Everything that arrived meanwhile is this same wake.
        while let Some(Some(())) = events.next().now_or_never() {}
        Some(((), (events, Some(tokio::time::Instant::now()))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bursts_become_one_wake_and_a_lone_event_passes_at_once() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let rx = tokio_stream_from(rx);
        let mut woken = Box::pin(throttle(rx, Duration::from_millis(500)));
        let t0 = tokio::time::Instant::now();
        tx.send(()).unwrap();
        woken.next().await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::ZERO,
            "the first event wakes at once"
        );
        for _ in 0..100 {
            tx.send(()).unwrap();
        }
        woken.next().await.unwrap();
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(500),
            "a burst waits out the interval"
        );
        assert!(
            woken.next().now_or_never().is_none(),
            "the burst was one wake"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        let t1 = tokio::time::Instant::now();
        tx.send(()).unwrap();
        woken.next().await.unwrap();
        assert_eq!(t1.elapsed(), Duration::ZERO, "quiet again: at once");
        drop(tx);
        assert!(woken.next().await.is_none(), "ends with its events");
    }

    fn tokio_stream_from(
        mut rx: tokio::sync::mpsc::UnboundedReceiver<()>,
    ) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
