"""Prefect tasks: one thin task per pipeline stage (arguments in, core/storage call, small result out)."""
