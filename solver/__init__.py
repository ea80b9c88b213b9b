"""The sharding solver: problem (enumerate) -> baselines / MILP (propose) -> water-filling
split (partition) -> cost model (estimate) -> manifest."""
