"""AgentDojo (MIT): environment adaptor (env), episode builder (builder), utility check (utility)."""
