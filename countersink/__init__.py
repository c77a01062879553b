"""Shared process plumbing: settings, logging, server clients and the command line."""
