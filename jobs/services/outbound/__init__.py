"""What trainhub tells the outside: webhook endpoints and deliveries, e-mail notifications."""
