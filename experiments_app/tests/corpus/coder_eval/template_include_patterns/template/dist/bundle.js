console.log('bundle')
