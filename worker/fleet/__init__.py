"""miro.worker.fleet: the control-plane library that `miro`'s commands, `miro serve` and the worker process
call. It imports miro.core and nothing of miro.worker.process, miro.worker.api or miro.cli
(tests/test_import_graph.py)."""
