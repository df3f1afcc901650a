"""One run pipeline for every way a scenario runs: a `RunPlan` (what runs, into which folder, judged in
which window), an executor that replays it (live: `simulator.pipeline.live.LiveExecutor`; sharded over
Ray: `simulator.pipeline.sharded.ShardedExecutor`; on the twin: `simulator.pipeline.twin.TwinExecutor`), and a
`Recorder` that owns the result folder's head and tail: run.json (one builder, settings always
masked), the record writer with the run's tallies, and the summary. The CLI picks an executor; adding
one touches no other."""
