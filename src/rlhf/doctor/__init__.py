"""The training doctor: rules over metric histories that name the classic RLHF failures and the fix to try
(`rlhf.doctor.rules`)."""
