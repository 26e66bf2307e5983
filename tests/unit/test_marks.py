"""The load's marks reach events.jsonl as they happen, never half-written."""

from thermab.experiment.interlock import MarkForwarder


class Recorder:
    def __init__(self):
        self.events = []

    def event(self, name, **fields):
        self.events.append((name, fields["t"], fields["rep"], fields["arm"]))


def test_marks_are_forwarded_once_and_only_when_complete(tmp_path):
    marks = tmp_path / "load_events.jsonl"
    run = Recorder()
    forwarder = MarkForwarder(run, marks, 2, "B")
    forwarder.poll()  # no file yet
    marks.write_text('{"event": "load_start", "t": 10.0}\n{"event": "probe_st')
    forwarder.poll()
    assert run.events == [("load_start", 10.0, 2, "B")], "a line still being written waits"
    marks.write_text('{"event": "load_start", "t": 10.0}\n{"event": "probe_start", "t": 12.5}\n')
    forwarder.poll()
    forwarder.poll()
    assert run.events == [("load_start", 10.0, 2, "B"), ("probe_start", 12.5, 2, "B")]
