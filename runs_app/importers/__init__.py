"""Results made elsewhere, imported as historical (read-only) runs: `coder_eval` reads the run
folders coder-eval writes."""
