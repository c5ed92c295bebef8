"""Healing: distill a converted MLA model back toward its original (teacher) model."""

from .trainer import HealConfig, heal

__all__ = ["HealConfig", "heal"]
