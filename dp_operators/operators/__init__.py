"""Airflow operators (thin: they resolve inputs, call the pure engine, publish)."""
