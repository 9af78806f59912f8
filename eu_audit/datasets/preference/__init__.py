"""The behavioral preference suite (written here; provider names from Faker)."""
