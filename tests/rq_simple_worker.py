"""RQ's own SimpleWorker, as the tests run it (miro.worker.jobs.generate through RQ, no BatchWorker), leaving as
soon as its burst ends.

RQ 3.0's worker polls its command channel every 60 s, and at teardown stops that thread; redis-py 8's
PubSubWorkerThread.stop() waits for the poll in progress, so a burst SimpleWorker held each test for up to 60 s after
its last job. The poll here wakes every 0.1 s, as BatchWorker's does every PUBSUB_POLL_S for the same reason
(worker/process/batch_worker.py); nothing else of RQ's worker changes."""

from rq import SimpleWorker

COMMAND_POLL_S = 0.1


class QuickExitSimpleWorker(SimpleWorker):
    def subscribe(self):
        """RQ's SimpleWorker.subscribe (rq/worker/base.py), its thread waking every COMMAND_POLL_S."""
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=COMMAND_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler)
