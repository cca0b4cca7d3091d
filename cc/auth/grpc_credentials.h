// What a gRPC call presents to an Authorizer: the bearer token of its
// `authorization` metadata and, over TLS, its verified client certificate's
// common name and subject alternative names (grpc::AuthContext).
//
// Thread safety: plain functions of their arguments.
#ifndef PSERVER_CC_AUTH_GRPC_CREDENTIALS_H_
#define PSERVER_CC_AUTH_GRPC_CREDENTIALS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "cc/auth/authorizer.h"
#include "grpcpp/server_context.h"

namespace pserver {

// The call's credentials.
Credentials CredentialsOf(const grpc::ServerContextBase& context);

// The token of an "authorization" value ("Bearer <token>"); "" when it is
// not of that form.
std::string BearerToken(absl::string_view authorization);

}  // namespace pserver

#endif  // PSERVER_CC_AUTH_GRPC_CREDENTIALS_H_
