"""`latentkv bench ...`: memory, speed and quality measured side by side with baselines."""
