"""Durable storage: sessions, investigations, events and the audit of every LLM exchange."""
