"""BFCL v4 (Apache-2.0): the deterministic backends (env) and the bfcl-memory / bfcl-tools builders."""
