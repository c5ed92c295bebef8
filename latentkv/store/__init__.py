"""The persistent latent store: full prefix-cache blocks on local disk (docs/store.md)."""
