"""`poirotd demo`: the CORTEX demo system and session, and the script that runs them."""
