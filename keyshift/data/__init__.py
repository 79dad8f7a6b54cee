"""Real inputs: fetch and verify them (`flights`), and replay them into Kafka (`replay`)."""
