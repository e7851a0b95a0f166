"""TokenRouter clients: CLI generation, benchmarks, load-test inputs."""
