"""Airflow hooks."""
