# Run 1 (session 32): last session's prepared run, as it is (one-row-sampler.diff applied; .base/ = git archive 112d165 engine scripts assets)
bash docs/benchmarks/session-s31/next-run.sh
